"""Reference rounds: the committed figures a bench round's regression guards compare against.

A reference is a slim copy of one real round's ``summary.json`` (the per-case figures the guards
read, the configuration that produced them and the machine it ran on), kept in
``mnn_h2o/bench/references/<model>-<kind>.json`` (kind ``round`` or ``quick``). A round uses the
reference of its model and kind only when the configuration matches it key for key (``gates`` and
``bench.output_dir`` aside: they do not change what is measured); otherwise it says which keys
differ and runs without figure guards. ``python -m mnn_h2o.bench reference RUN`` writes one from a
run folder.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Tuple

REFERENCE_VERSION = 2  # 2: speed as decode_vs_baseline, measured on interleaved steps
DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "references")
# What a reference keeps of each case row: what the guards read, and the key that names the row.
_ROW_KEYS = ("case", "prompt_tokens", "kv_bytes_held", "lossy_ratio", "total_ratio", "kl", "top1_agreement",
             "decode_tps", "decode_vs_baseline")
# Settings that do not change a figure a guard reads (the bench runs no server).
_IGNORED = ("gates", "serve", "bench.output_dir")


def measured_config(cfg: dict) -> dict:
    """The part of a configuration that decides the figures: every section but ``gates`` and
    ``serve``, without ``bench.output_dir``."""
    out = {}
    for section, values in cfg.items():
        if section in _IGNORED:
            continue
        out[section] = {k: v for k, v in values.items() if f"{section}.{k}" not in _IGNORED}
    return out


def model_slug(name: str) -> str:
    base = os.path.basename(name)
    return base[:-5] if base.endswith(".gguf") else base


def default_path(model: str, quick: bool) -> str:
    return os.path.join(DIRECTORY, f"{model_slug(model)}-{'quick' if quick else 'round'}.json")


def from_summary(summary: dict) -> dict:
    rows = []
    for r in summary["cases"]:
        row = {k: r[k] for k in _ROW_KEYS}
        row["lossless_ratio"] = r["store"]["lossless_ratio"]
        rows.append(row)
    env = summary["environment"]
    return {"reference_version": REFERENCE_VERSION, "model": summary["model"], "quick": bool(summary["quick"]),
            "started": summary["started"], "commit": env.get("commit", "-"), "cpu": env.get("cpu", "-"),
            "isa": env.get("isa", "-"), "cores": env.get("cores"),
            "config": measured_config(summary["config"]), "cases": rows}


def write(summary: dict, path: str) -> str:
    ref = from_summary(summary)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read(path: str) -> dict:
    from .report import read_json

    ref = read_json(path, "reference round")
    if not isinstance(ref, dict) or ref.get("reference_version") != REFERENCE_VERSION or \
            not isinstance(ref.get("cases"), list) or not isinstance(ref.get("config"), dict):
        raise ValueError(f"{path} is not a reference round of version {REFERENCE_VERSION} "
                         "(make one with: python -m mnn_h2o.bench reference RUN_FOLDER)")
    return ref


def _flat(cfg: dict) -> dict:
    return {f"{section}.{k}": v for section, values in cfg.items() for k, v in values.items()}


def config_differences(ref: dict, cfg: dict) -> List[str]:
    """The ``section.key`` names whose values differ between the reference and ``cfg``. A key the
    reference does not hold was added after it was recorded, at a default that keeps what it
    measured (docs/config.md): it differs only where ``cfg`` sets another value."""
    from .. import config

    a, b = _flat(measured_config(ref["config"])), _flat(measured_config(cfg))
    defaults = _flat(config.defaults())
    return sorted(n for n in a.keys() | b.keys() if a.get(n, defaults.get(n)) != b.get(n))


def select(cfg: dict, quick: bool, path: Optional[str] = None) -> Tuple[Optional[dict], str]:
    """(the reference a round is guarded by, or None; one line saying which and why). An explicit
    ``path`` that cannot be read or does not match is an error; a missing default is not."""
    explicit = path is not None
    path = path or default_path(cfg["model"]["name"], quick)
    if not explicit and not os.path.exists(path):
        return None, (f"no reference round for model {model_slug(cfg['model']['name'])} "
                      f"({'--quick' if quick else 'full'} round): figure guards skipped, invariants checked")
    ref = read(path)
    if bool(ref["quick"]) != bool(quick):
        msg = f"reference {path} is a {'--quick' if ref['quick'] else 'full'} round; this is not"
        if explicit:
            raise ValueError(msg)
        return None, msg + ": figure guards skipped"
    diff = config_differences(ref, cfg)
    if diff:
        msg = (f"reference {path} was measured with other settings ({', '.join(diff[:6])}"
               f"{', ...' if len(diff) > 6 else ''})")
        if explicit:
            raise ValueError(msg)
        return None, msg + ": figure guards skipped, invariants checked"
    return ref, f"reference {path} (commit {ref['commit']}, {ref['cpu']}, {ref['started']})"
