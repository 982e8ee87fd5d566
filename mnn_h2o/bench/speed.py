"""Prefill and decode speed of our engine against stock MNN.llm on the same export.

Candidates: ``ours`` (full KV cache), ``ours_h2o`` (the config's H2O eviction, when enabled)
and ``stock`` (MNN.llm with its fused attention). All live in one process and are timed from
Python the same way: reset, prefill the context (real essay text), then greedy-decode
``n_decode`` tokens. Runs rotate through the candidates (A B C / C B A ...) for ``repetitions``
rounds; we report medians, spreads and ratios of medians, and for our engine where the decode
time goes (MNN module forwards, native cache step incl. eviction, Python glue).
"""
from __future__ import annotations

import time
from typing import Dict, Sequence

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
              n_decode: int = 64, repetitions: int = 3, h2o: dict | None = None,
              progress: bool = True) -> Dict[str, dict]:
    """``ours`` is an :class:`~mnn_h2o.engine.Llm`; with an ``h2o`` section it is also run with
    eviction on (same instance, reconfigured before each run)."""
    from tqdm import tqdm

    from ..essays import essay_tokens

    def ours_run(ids, n, section):
        ours.configure_h2o(section)
        return time_run(ours, ids, n)

    names = ["ours"] + (["ours_h2o"] if h2o else []) + ["stock"]
    out: Dict[str, dict] = {}
    bar = tqdm(total=len(contexts) * repetitions * len(names), desc="speed", unit="run", disable=not progress)
    for ctx in contexts:
        ids = essay_tokens(tokenizer, ctx)
        runners = {"ours": lambda: ours_run(ids, n_decode, None),
                   "ours_h2o": lambda: ours_run(ids, n_decode, h2o),
                   "stock": lambda: time_run(stock, ids, n_decode)}
        runners = {n: runners[n] for n in names}
        # One untimed warm-up: first-use resizes of MNN's graphs are not steady state.
        ours_run(ids[:64], 4, None)
        time_run(stock, ids[:64], 4)
        runs = interleave(runners, repetitions, on_run=lambda *_: bar.update(1))
        row: Dict[str, dict] = {"context": ctx, "n_decode": n_decode, "repetitions": repetitions}
        for name, rs in runs.items():
            row[name] = {k: summarize([r[k] for r in rs]) for k in ("prefill_tps", "decode_tps")}
            if name != "stock":
                row[name]["decode_ms"] = {k: summarize([r["decode_ms"][k] for r in rs])["median"]
                                          for k in ("total", "mnn", "attention", "glue")}
                row[name]["kv_bytes_held"] = rs[-1]["kv_bytes_held"]
        for a, b in (("ours", "stock"), ("ours_h2o", "ours"), ("ours_h2o", "stock")):
            if a in row:
                for k in ("prefill_tps", "decode_tps"):
                    row[f"{k[:-4]}_ratio_{a}_vs_{b}"] = row[a][k]["median"] / row[b][k]["median"]
        out[str(ctx)] = row
    bar.close()
    ours.configure_h2o(None)
    return out


def format_table(results: Dict[str, dict]) -> str:
    f = lambda s: f"{s['median']:.1f} (±{s['spread'] * 50:.0f}%)"
    lines = ["| context | engine | prefill tok/s | decode tok/s | decode ms/token: mnn / attention / glue | KV MiB held | prefill vs stock | decode vs stock | decode vs ours full |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ctx, r in results.items():
        for name in ("ours", "ours_h2o", "stock"):
            if name not in r:
                continue
            e = r[name]
            d = e.get("decode_ms")
            ms = f"{d['mnn']:.2f} / {d['attention']:.2f} / {d['glue']:.2f}" if d else ""
            kv = f"{e['kv_bytes_held'] / 2**20:.1f}" if "kv_bytes_held" in e else ""
            vs = lambda k, b: f"{r[f'{k}_ratio_{name}_vs_{b}']:.2f}x" if f"{k}_ratio_{name}_vs_{b}" in r else ""
            lines.append(f"| {ctx} | {name} | {f(e['prefill_tps'])} | {f(e['decode_tps'])} | {ms} | {kv} | "
                         f"{vs('prefill', 'stock')} | {vs('decode', 'stock')} | {vs('decode', 'ours')} |")
    lines.append("tokens/s: median over the repetitions (± half the min-max spread).")
    return "\n".join(lines)
