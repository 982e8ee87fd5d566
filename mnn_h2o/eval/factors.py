"""Factor grid: which part of our eviction costs quality, one setting at a time.

``python -m mnn_h2o.eval factors --split dev --ratios 3.2 --variants base,layers0,... --json F``
runs our h2o policy under named *variants* of the config (each changes one factor, or several
for ``all``) on the frontier suite's segments, every variant against the same full-cache
reference of its runtime settings, and prints one table: mean KL per domain and prompt length,
their mean, top-1 and the measured whole-model ratio. Results are appended to the JSON file
after every run (``--resume`` skips runs already in it). Choose defaults on ``--split dev``.

A variant is a set of config overrides (``section.key: value``) applied over the base config
(``--config`` or the defaults), plus, for ``keep_for_end``, a static keep ratio computed per
segment so that a cache that evicts only at the end of the prompt still ends the teacher-forced
continuation at the target whole-model ratio (kvpress's way of counting its ratio).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .quality import metrics, teacher_forced

NO_DECODE = 1 << 20  # update_interval that never comes within a continuation


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    overrides: Dict[str, object] = field(default_factory=dict)
    keep_for_end: bool = False  # static keep ratio so that the end state meets the target


VARIANTS: Dict[str, Variant] = {v.name: v for v in (
    Variant("base", "the config as given (the default, or --config)"),
    Variant("h2o", "accumulated attention with the same budget in every layer (eviction.policy h2o, "
            "eviction.layer_budget uniform): no reconstruction pass", {"eviction.policy": "h2o", "eviction.layer_budget": "uniform"}),
    Variant("old", "the h2o default before issue 19: layers 0-1 exempt, eviction after every prefill chunk, "
            "floors never shrink", {"eviction.policy": "h2o", "eviction.layer_budget": "uniform", "eviction.layer_start": 2,
                                    "eviction.prefill_eviction": "chunk", "eviction.max_floor_share": 0.0}),
    Variant("all_keys", "kvzip's pass scores every held token with a softmax over every key the queries "
            "see, each chunk all tokens (eviction.reconstruction_softmax all; the default's is KVzip's: 4 sinks, "
            "the chunk and the pass)", {"eviction.reconstruction_softmax": "all"}),
    Variant("layers0", "no exempt layers: every layer evicts (eviction.layer_start 0)", {"eviction.layer_start": 0}),
    Variant("floors16", "small floors: sink 16, recent 16 tokens (one block each)",
            {"eviction.sink_tokens": 16, "eviction.recent_tokens": 16}),
    Variant("floors_half", "floors halved: sink 32, recent 128", {"eviction.sink_tokens": 32, "eviction.recent_tokens": 128}),
    Variant("block32", "coarser blocks: 32 tokens (16 is the kernels' minimum)", {"runtime.block_tokens": 32}),
    Variant("block64", "coarser blocks: 64 tokens", {"runtime.block_tokens": 64}),
    Variant("float", "float weights and activations (model.weight_bits 0, runtime.memory normal) "
            "instead of int8: is the int8 engine's noise part of the loss?",
            {"model.weight_bits": 0, "runtime.memory": "normal"}),
    Variant("normal", "float activations with the same int8 weights (runtime.memory normal): the "
            "int8 engine's activation noise alone", {"runtime.memory": "normal"}),
    Variant("prefill_end", "evict once after the whole prompt, not after every prefill chunk",
            {"eviction.prefill_eviction": "end"}),
    Variant("no_decode", "no eviction during the continuation; the prompt is cut so that the end "
            "state meets the target", {"eviction.update_interval": NO_DECODE}, keep_for_end=True),
    Variant("interval1", "re-evict after every decode token", {"eviction.update_interval": 1}),
    Variant("ema0", "no EMA memory (ema_alpha 0: the last interval's mean only)", {"eviction.ema_alpha": 0.0}),
    Variant("ema09", "long EMA memory (ema_alpha 0.9)", {"eviction.ema_alpha": 0.9}),
    Variant("per_head", "shared per-layer budget across kv heads (per_head_budget)", {"eviction.per_head_budget": True}),
    Variant("adakv", "shared per-layer budget with an AdaKV per-head minimum of half the per-head "
            "budget (per_head_budget, head_floor_share 0.5)",
            {"eviction.per_head_budget": True, "eviction.head_floor_share": 0.5}),
    Variant("pyramid", "PyramidKV layer budgets: decreasing with depth, same whole-model total "
            "(eviction.layer_budget pyramid)", {"eviction.layer_budget": "pyramid"}),
    Variant("share0", "old floor rule: a head whose floors exceed its budget is left alone "
            "(eviction.max_floor_share 0)", {"eviction.max_floor_share": 0.0}),
    Variant("share1", "floors shrink to fit the budget (eviction.max_floor_share 1)", {"eviction.max_floor_share": 1.0}),
    Variant("share05", "floors take at most half the budget (eviction.max_floor_share 0.5)",
            {"eviction.max_floor_share": 0.5}),
    Variant("kvpress_like", "layers0 + prefill_end + no_decode + floors16 together: kvpress's "
            "ObservedAttention setting within our blocks",
            {"eviction.layer_start": 0, "eviction.prefill_eviction": "end", "eviction.update_interval": NO_DECODE,
             "eviction.sink_tokens": 16, "eviction.recent_tokens": 16}, keep_for_end=True),
)}


def keep_for_end(n_layers: int, evicting: int, prompt: int, decoded: int, ratio: float) -> float:
    """Keep ratio for the prompt's tokens in the evicting layers such that after ``decoded``
    more tokens kept in full the whole model holds 1/ratio of every token written."""
    total = prompt + decoded
    per_layer = (n_layers * total / ratio - (n_layers - evicting) * total) / evicting
    return (per_layer - decoded) / prompt


def combine(name: str) -> Variant:
    """``a+b+c``: the overrides of variants a, b and c together (later ones win)."""
    parts = [p for p in name.split("+") if p]
    for p in parts:
        if p not in VARIANTS:
            raise ValueError(f"unknown variant {p!r} (allowed: {', '.join(VARIANTS)}, or several joined by +)")
    if len(parts) == 1:
        return VARIANTS[parts[0]]
    overrides: Dict[str, object] = {}
    for p in parts:
        overrides.update(VARIANTS[p].overrides)
    return Variant(name, " + ".join(VARIANTS[p].what for p in parts), overrides,
                   any(VARIANTS[p].keep_for_end for p in parts))


def parse_variants(spec: str) -> List[Variant]:
    out = []
    for name in (s.strip() for s in spec.split(",")):
        if name:
            out.append(combine(name))
    if not out:
        raise ValueError("no variants given")
    return out


def _runtime_key(cfg: dict) -> str:
    return json.dumps({s: cfg[s] for s in ("model", "runtime")}, sort_keys=True)


class Grid:
    def __init__(self, config_mod, base_path: Optional[str], path: str, resume: bool, meta: dict):
        self.config_mod, self.base_path, self.path = config_mod, base_path, path
        self.runs: List[dict] = []
        if os.path.exists(path):
            if not resume:
                raise ValueError(f"{path} exists: pass --resume to continue it, or choose another --json")
            with open(path) as f:
                self.runs = json.load(f)["runs"]
        self.meta = meta
        self._llms: Dict[str, object] = {}
        self._refs: Dict[tuple, np.ndarray] = {}

    def cfg(self, v: Variant) -> dict:
        cfg = self.config_mod.load(self.base_path, dict(v.overrides))
        cfg["lossless"]["mode"] = "off"
        return cfg

    def llm(self, cfg: dict):
        k = _runtime_key(cfg)
        if k not in self._llms:
            from ..engine import Llm
            from ..export import ensure_exported

            self._llms[k] = Llm(ensure_exported(cfg["model"], progress=False), cfg)
        return self._llms[k]

    def done(self, key: tuple) -> bool:
        return any(_key(r) == key for r in self.runs)

    def ref(self, cfg: dict, seg) -> np.ndarray:
        k = (_runtime_key(cfg), seg.domain, seg.index, len(seg.prompt))
        if k not in self._refs:
            llm = self.llm(cfg)
            llm.configure_eviction(None)
            self._refs[k] = teacher_forced(llm, seg.prompt, seg.continuation).logp
        return self._refs[k]

    def run(self, v: Variant, ratio: float, seg) -> dict:
        cfg = self.cfg(v)
        ref = self.ref(cfg, seg)
        llm = self.llm(cfg)
        h = dict(cfg["eviction"], enabled=True, target_keep_ratio=0.0, target_lossy_ratio=ratio, kv_budget_bytes=0)
        if v.keep_for_end:
            c = llm.config
            evicting = (h["layer_end"] if h["layer_end"] != -1 else c.n_layers) - h["layer_start"]
            keep = keep_for_end(c.n_layers, evicting, len(seg.prompt), len(seg.continuation) - 1, ratio)
            h.update(target_keep_ratio=min(max(keep, 1e-6), 1.0))
        llm.configure_eviction(h)
        t0 = time.perf_counter()
        tr = teacher_forced(llm, seg.prompt, seg.continuation)
        run = {"variant": v.name, "target_ratio": ratio, "domain": seg.domain, "split": seg.split,
               "segment": seg.index, "prompt_tokens": len(seg.prompt), "bytes_held": int(tr.kv_bytes_held),
               "ratio": tr.f16_bytes / tr.kv_bytes_held, "seconds": round(time.perf_counter() - t0, 1),
               "overrides": {k: v2 for k, v2 in v.overrides.items()},
               "keep_ratio": h["target_keep_ratio"] or None,
               "skipped": {k: sum(l["skipped"][k] for l in llm.cache.eviction_stats()["layers"])
                           for k in llm.cache.eviction_stats()["layers"][0]["skipped"]}}
        run.update(metrics(ref, tr.logp, seg.continuation))
        self.runs.append(run)
        self.save()
        return run

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": self.meta, "runs": self.runs}, f, indent=1)
        os.replace(tmp, self.path)


def _key(r: dict) -> tuple:
    return (r["variant"], r["target_ratio"], r["domain"], r["split"], r["segment"], r["prompt_tokens"])


def table(runs: Sequence[dict], variants: Optional[Sequence[str]] = None) -> str:
    """One row per (variant, target): KL per domain x prompt length, mean KL, mean top-1, ratio."""
    cols = sorted({(r["prompt_tokens"], r["domain"]) for r in runs})
    names = list(variants) if variants else list(dict.fromkeys(r["variant"] for r in runs))
    lens = sorted({n for n, _ in cols})
    head = ("| variant | target | " + " | ".join(f"{d} {n}" for n, d in cols) + " | "
            + " | ".join(f"mean {n}" for n in lens) + " | mean KL | mean top-1 | ratio |")
    out = [head, "|---|---:|" + "---:|" * (len(cols) + len(lens) + 3)]
    for t in sorted({r["target_ratio"] for r in runs}):
        for name in names:
            rs = [r for r in runs if r["variant"] == name and r["target_ratio"] == t]
            if not rs:
                continue
            cells = []
            for n, d in cols:
                x = [r["kl"] for r in rs if (r["prompt_tokens"], r["domain"]) == (n, d)]
                cells.append(f"{np.mean(x):.4f}" if x else "-")
            for n in lens:  # per prompt length, only when every domain of it ran
                x = [r["kl"] for r in rs if r["prompt_tokens"] == n]
                cells.append(f"{np.mean(x):.4f}" if {r["domain"] for r in rs if r["prompt_tokens"] == n}
                             == {d for m, d in cols if m == n} else "-")
            full = len(rs) == len(cols) * len({r["segment"] for r in rs})
            mean = f"{np.mean([r['kl'] for r in rs]):.4f}" + ("" if full else "*")
            out.append(f"| {name} | {t:g} | " + " | ".join(cells) + f" | {mean} | "
                       f"{np.mean([r['top1'] for r in rs]):.3f} | {np.mean([r['ratio'] for r in rs]):.2f} |")
    return "\n".join(out)


def sweep(args, config_mod) -> int:
    from tqdm import tqdm

    from . import domains as D

    variants = parse_variants(args.variants)
    doms = [d for d in args.domains.split(",") if d]
    meta = {"split": args.split, "continuation": args.continuation, "base_config": args.config,
            "variants": {v.name: {"what": v.what, "overrides": v.overrides, "keep_for_end": v.keep_for_end}
                         for v in variants}}
    grid = Grid(config_mod, args.config, args.json, args.resume, meta)
    for v in variants:
        grid.cfg(v)  # a bad override fails before any run
    tok = grid.llm(grid.cfg(variants[0])).tokenizer
    segs = [s for n in args.prompt_lens for d in doms
            for s in D.segments(tok, d, args.split, n, args.continuation, args.segments)]
    todo = [(v, t, s) for s in segs for t in args.ratios for v in variants
            if not grid.done((v.name, t, s.domain, s.split, s.index, len(s.prompt)))]
    for v, t, s in tqdm(todo, desc="factors", unit="run"):
        r = grid.run(v, t, s)
        tqdm.write(f"{v.name} {t:g} {s.domain} {len(s.prompt)}: KL {r['kl']:.4f} top-1 {r['top1']:.3f} "
                   f"ratio {r['ratio']:.2f} ({r['seconds']:.0f} s)")
    report = table(grid.runs, [v.name for v in variants] + [n for n in dict.fromkeys(
        r["variant"] for r in grid.runs) if n not in {v.name for v in variants}])
    prefix = args.json[:-5] if args.json.endswith(".json") else args.json
    with open(prefix + ".md", "w") as f:
        f.write(report + "\n")
    print(report)
    return 0
