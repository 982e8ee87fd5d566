"""The fair frontier: our default against presses that also quantise, read off frontier files.

``python -m mnn_h2o.eval fair FILE [FILE ...]`` takes the rows of one or more ``frontier``
output files (a later file's row replaces an earlier one's for the same method, domain, prompt
length and target, so a re-measured default can be read beside peers measured before) and, per
point (prompt length, target ratio, domain), sets side by side:

  - the default (``--default``, ours:kvzip@q8r unless told);
  - the best one-pass press over q8_0: the lowest KL of the kvpress ``@q8`` presses that score
    the cache in the prefill's own pass (every press but kvzip, which re-reads the context);
  - KVzip over q8_0 (kvpress:kvzip@q8), the anchor of our reconstruction policy;
  - the default's rows alone (ours:none@q8r for ours:kvzip@q8r), our engine's floor with those
    rows, where the files have it.

It writes PREFIX.md (the table, the means per target and the issue's bars: default <= 1.1x the
best press, default <= 2x KVzip@q8, kl_exact of the default within 1.5x of the best press's) and
PREFIX.png (log-KL bars, one panel per target). KL is each engine's against its own full cache.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from statistics import mean
from typing import Dict, List, Optional, Sequence

KVZIP = "kvpress:kvzip@q8"


def rows_name(default: str) -> str:
    """The default's row type: ours:kvzip@q8r -> q8r (f16 when the method names none)."""
    return default.split("@", 1)[1] if "@" in default else "f16"


def rows_alone(default: str) -> str:
    """The full cache over the default's row type: its floor (ours:none@q8 for ours:kvzip@q8)."""
    return "ours:none@" + rows_name(default)
# The bars (docs/results.md, "The fair frontier").
BAR_BEST_PRESS = 1.1
BAR_KVZIP = 2.0
BAR_EXACT = 1.5


def is_one_pass_press(row: dict) -> bool:
    """A kvpress press over q8_0 that evicts from the prefill's own scores."""
    return (row["engine"] == "kvpress" and row["kv_dtype"] == "q8" and row["policy"] not in ("none", "kvzip"))


def load_rows(paths: Sequence[str]) -> List[dict]:
    """The teacher-forced rows of the files; a later file's row replaces an earlier one's."""
    merged: Dict[tuple, dict] = {}
    for p in paths:
        try:
            with open(p) as f:
                rows = json.load(f)["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{p}: not a frontier output file ({e})") from None
        for r in rows:
            if r.get("kind") == "kl":
                merged[(r["method"], r["domain"], r["prompt_tokens"], r["target_ratio"])] = r
    return list(merged.values())


@dataclass
class Point:
    prompt_tokens: int
    target: float
    domain: str
    default: dict
    best_press: Optional[dict]
    kvzip: Optional[dict]
    rows_alone: Optional[dict]


def _close(a: Optional[float], b: float) -> bool:
    return a is not None and abs(a - b) < 1e-6


def points(rows: Sequence[dict], default: str) -> List[Point]:
    """One point per (prompt length, target, domain) where the default ran."""
    out = []
    for d in sorted((r for r in rows if r["method"] == default and r["target_ratio"]),
                    key=lambda r: (r["prompt_tokens"], r["target_ratio"], r["domain"])):
        same = [r for r in rows if r["domain"] == d["domain"] and r["prompt_tokens"] == d["prompt_tokens"]]
        at = [r for r in same if _close(r["target_ratio"], d["target_ratio"]) and r.get("kl") is not None]
        presses = [r for r in at if is_one_pass_press(r)]
        kvzip = [r for r in at if r["method"] == KVZIP]
        alone = [r for r in same if r["method"] == rows_alone(default)]
        out.append(Point(d["prompt_tokens"], d["target_ratio"], d["domain"], d,
                         min(presses, key=lambda r: r["kl"]) if presses else None,
                         kvzip[0] if kvzip else None, alone[0] if alone else None))
    return out


def _f(v: Optional[float], digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def table(pts: Sequence[Point], default: str) -> str:
    """Markdown: the points, the means per target, and each bar's count."""
    out = [(f"| prompt | target | domain | default ({default}): x / KL | {rows_name(default)} alone | best one-pass press@q8: "
            "press, x / KL | KVzip@q8: x / KL | default / best press | default / KVzip@q8 | "
            "kl_exact: default / best press |"),
           "|---:|---:|---|---|---:|---|---|---:|---:|---|"]
    for p in pts:
        d, b, z, a = p.default, p.best_press, p.kvzip, p.rows_alone
        out.append(
            f"| {p.prompt_tokens} | {p.target:g} | {p.domain} | {d['ratio']:.2f} / {_f(d['kl'])} | "
            f"{_f(a['kl']) if a else '-'} | "
            + (f"{b['policy']}, {b['ratio']:.2f} / {_f(b['kl'])}" if b else "-") + " | "
            + (f"{z['ratio']:.2f} / {_f(z['kl'])}" if z else "-") + " | "
            f"{_f(_ratio(d['kl'], b['kl'] if b else None), 2)} | {_f(_ratio(d['kl'], z['kl'] if z else None), 2)} | "
            f"{_f(d.get('kl_exact'))} / {_f(b.get('kl_exact') if b else None)} |")
    out.append("")
    for t in sorted({p.target for p in pts}):
        at = [p for p in pts if p.target == t]
        line = [f"At {t:g}x, mean over {len(at)} points: the default {_f(mean(p.default['kl'] for p in at))}"]
        with_b = [p for p in at if p.best_press]
        if with_b:
            line.append(f"the best press {_f(mean(p.best_press['kl'] for p in with_b))}")
            n_ok = sum(p.default["kl"] <= BAR_BEST_PRESS * p.best_press["kl"] for p in with_b)
            line.append(f"default <= {BAR_BEST_PRESS}x the best press at {n_ok} of {len(with_b)}")
            ex = [p for p in with_b if p.default.get("kl_exact") is not None
                  and p.best_press.get("kl_exact") is not None]
            if ex:
                mo, mb = mean(p.default["kl_exact"] for p in ex), mean(p.best_press["kl_exact"] for p in ex)
                line.append(f"kl_exact {_f(mo)} against {_f(mb)} ({mo / mb:.2f}x; bar {BAR_EXACT}x)")
        with_z = [p for p in at if p.kvzip]
        if with_z:
            line.append(f"KVzip@q8 {_f(mean(p.kvzip['kl'] for p in with_z))}")
            n_ok = sum(p.default["kl"] <= BAR_KVZIP * p.kvzip["kl"] for p in with_z)
            line.append(f"default <= {BAR_KVZIP:g}x KVzip@q8 at {n_ok} of {len(with_z)}")
        with_a = [p for p in at if p.rows_alone]
        if with_a:
            line.append(f"{rows_name(default)} alone {_f(mean(p.rows_alone['kl'] for p in with_a))}")
        out.append("; ".join(line) + ".")
    return "\n".join(out)


def plot(pts: Sequence[Point], path: str, default: str) -> None:
    """Log-KL bars per point, one panel per target: default, best press, KVzip, the rows alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted({p.target for p in pts})
    fig, axes = plt.subplots(1, len(targets), figsize=(6.2 * len(targets), 4.2), squeeze=False, sharey=True)
    series = [("our default (" + default + ")", lambda p: p.default, "tab:blue"),
              ("best one-pass press@q8", lambda p: p.best_press, "tab:orange"),
              ("KVzip@q8 (kvpress)", lambda p: p.kvzip, "tab:green"),
              (f"{rows_name(default)} alone (our engine's floor with those rows)", lambda p: p.rows_alone, "tab:grey")]
    for ax, t in zip(axes[0], targets):
        at = [p for p in pts if p.target == t]
        w = 0.8 / len(series)
        for k, (label, get, color) in enumerate(series):
            xs = [i + (k - (len(series) - 1) / 2) * w for i, p in enumerate(at) if get(p)]
            ys = [get(p)["kl"] for p in at if get(p)]
            if xs:
                ax.bar(xs, ys, width=w, color=color, label=label)
        for i, p in enumerate(at):
            if p.best_press:
                ax.annotate(p.best_press["policy"], (i - 0.5 * w, p.best_press["kl"]), fontsize=7,
                            ha="center", va="bottom", rotation=90, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(at)), [f"{p.domain}\n{p.prompt_tokens}" for p in at], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{t:g}x less KV than f16 (whole model)", fontsize=10)
        ax.set_ylabel("KL against own full cache, nats (lower is better)")
        ax.grid(alpha=0.3, axis="y", which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def report(paths: Sequence[str], default: str, prefix: str) -> str:
    pts = points(load_rows(paths), default)
    if not pts:
        raise ValueError(f"no teacher-forced rows of {default} with a target ratio in {', '.join(paths)}")
    text = table(pts, default)
    with open(prefix + ".md", "w") as f:
        f.write(text + "\n")
    plot(pts, prefix + ".png", default)
    return text
