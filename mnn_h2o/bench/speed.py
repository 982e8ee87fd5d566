"""Prefill and decode speed of our engine against stock MNN.llm on the same export.

Both engines live in one process and are timed from Python the same way: reset, prefill the
context (real essay text), then greedy-decode ``n_decode`` tokens. Runs alternate A B / B A for
``repetitions`` rounds; we report medians, spreads and the ratio of medians, and for our
engine where the decode time goes (MNN module forwards, native cache step, Python glue).
"""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

from .measure import interleave, summarize


def time_run(engine, ids: Sequence[int], n_decode: int) -> dict:
    """One fresh context: prefill ``ids`` then decode ``n_decode`` greedy tokens."""
    engine.reset()
    stats = getattr(engine, "stats", None)
    t0 = time.perf_counter()
    logits = engine.prefill(ids)
    t1 = time.perf_counter()
    before = (stats.mnn_s, stats.attention_s) if stats is not None else None
    tok = int(logits.argmax())
    for _ in range(n_decode):
        tok = int(engine.decode(tok).argmax())
    t2 = time.perf_counter()
    r = {"prefill_tps": len(ids) / (t1 - t0), "decode_tps": n_decode / (t2 - t1)}
    if before is not None:
        per_tok = 1e3 / n_decode
        stats = engine.stats
        r["decode_ms"] = {
            "total": (t2 - t1) * per_tok,
            "mnn": (stats.mnn_s - before[0]) * per_tok,
            "attention": (stats.attention_s - before[1]) * per_tok,
        }
        r["decode_ms"]["glue"] = r["decode_ms"]["total"] - r["decode_ms"]["mnn"] - r["decode_ms"]["attention"]
        r["kv_bytes_held"] = stats.kv_bytes_held
    return r


def run_speed(ours, stock, tokenizer, contexts: Sequence[int] = (512, 2048, 4096),
              n_decode: int = 64, repetitions: int = 3, progress: bool = True) -> Dict[str, dict]:
    from tqdm import tqdm

    from ..essays import essay_tokens

    out: Dict[str, dict] = {}
    bar = tqdm(total=len(contexts) * repetitions * 2, desc="speed", unit="run", disable=not progress)
    for ctx in contexts:
        ids = essay_tokens(tokenizer, ctx)
        # One untimed warm-up each: first-use resizes of MNN's graphs are not steady state.
        time_run(ours, ids[:64], 4)
        time_run(stock, ids[:64], 4)
        runs = interleave({"ours": lambda: time_run(ours, ids, n_decode),
                           "stock": lambda: time_run(stock, ids, n_decode)},
                          repetitions, on_run=lambda *_: bar.update(1))
        row: Dict[str, dict] = {"context": ctx, "n_decode": n_decode, "repetitions": repetitions}
        for name, rs in runs.items():
            row[name] = {k: summarize([r[k] for r in rs]) for k in ("prefill_tps", "decode_tps")}
        row["ours"]["decode_ms"] = {k: summarize([r["decode_ms"][k] for r in runs["ours"]])["median"]
                                    for k in ("total", "mnn", "attention", "glue")}
        for k in ("prefill_tps", "decode_tps"):
            row[k.replace("_tps", "_ratio")] = row["ours"][k]["median"] / row["stock"][k]["median"]
        out[str(ctx)] = row
    bar.close()
    return out


def format_table(results: Dict[str, dict]) -> str:
    lines = ["| context | prefill ours | prefill stock | ratio | decode ours | decode stock | ratio | ours decode ms: mnn / attention / glue |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda s: f"{s['median']:.1f} (±{s['spread'] * 50:.0f}%)"
    for ctx, r in results.items():
        d = r["ours"]["decode_ms"]
        lines.append(f"| {ctx} | {f(r['ours']['prefill_tps'])} | {f(r['stock']['prefill_tps'])} | "
                     f"{r['prefill_ratio']:.2f}x | {f(r['ours']['decode_tps'])} | {f(r['stock']['decode_tps'])} | "
                     f"{r['decode_ratio']:.2f}x | {d['mnn']:.2f} / {d['attention']:.2f} / {d['glue']:.2f} |")
    lines.append("tokens/s, median over the repetitions (± half the min-max spread).")
    return "\n".join(lines)
