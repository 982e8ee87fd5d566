"""Prefill and decode speed of our engine against stock MNN.llm on the same export.

Candidates: ``ours`` (full KV cache), ``ours_evict`` (the config's eviction, when enabled),
``stock`` (MNN.llm with its fused attention) and, with ``llama``, llama.cpp in the configs of
:data:`~mnn_h2o.bench.llama_peer.CONFIGS` on the same GGUF file (``llama_peer``). All live in one
process and are timed from Python the same way: reset, prefill the context (real essay text, the
same token ids for every engine), then greedy-decode ``n_decode`` tokens. Runs rotate through the
candidates (A B C / C B A ...) for ``repetitions`` rounds; we report medians, spreads and ratios of
medians, and for our engine where the prefill and decode time goes (MNN module forwards, native cache step
incl. eviction, Python glue). With ``llama``, each compressing candidate's quality against its own
full cache is measured too, untimed: mean KL and top-1 agreement over ``n_decode`` essay tokens
after the prompt, teacher-forced one token at a time.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

from ..measure import SPLIT_KEYS, interleave, log_softmax, summarize, time_run

LLAMA_ROWS = ("llama_f16", "llama_f16_fa", "llama_q8_fa")


def teacher_forced_logp(engine, prompt: Sequence[int], continuation: Sequence[int]):
    """Log-probs [n, vocab] after ``prompt`` and each prefix of ``continuation``, fed one token at a
    time (row i predicts continuation[i]), as the bench's quality cases do."""
    import numpy as np

    engine.reset()
    logits = engine.prefill(prompt)
    out = np.empty((len(continuation), logits.shape[-1]), np.float32)
    for i, t in enumerate(continuation):
        out[i] = log_softmax(logits)
        logits = engine.decode(int(t))
    return out


def run_speed(ours, stock, tokenizer, contexts: Sequence[int] = (512, 2048, 4096),
              n_decode: int = 64, repetitions: int = 3, eviction: dict | None = None,
              progress: bool = True, llama: Callable[[int], Dict[str, object]] | None = None,
              llama_rows: Sequence[str] = LLAMA_ROWS, ours_full: bool = True,
              measure_quality: bool = True) -> Dict[str, dict]:
    """``ours`` is an :class:`~mnn_h2o.engine.Llm`; with an ``eviction`` section it is also run with
    eviction on (same instance, reconfigured before each run); ``ours_full`` False leaves out the
    full-cache row (``ours`` is then only the untimed reference of ``ours_evict``'s quality).
    ``stock`` may be None (no stock row). ``llama(n_ctx)`` makes the llama.cpp peers for one context length ({name:
    :class:`~mnn_h2o.bench.llama_peer.LlamaPeer`}); they join the interleaved rounds and are
    closed after it; ``llama_rows`` names the peers it makes (for the progress bar). ``measure_quality``
    False skips the untimed quality measurements of the llama rows' runs. Our rows keep each
    run's time split (``runs``: [{prefill_ms, decode_ms}]) beside its medians."""
    from tqdm import tqdm

    from ..essays import essay_tokens
    from .cases import quality

    def ours_run(ids, n, section):
        ours.configure_eviction(section)
        return time_run(ours, ids, n)

    names = (["ours"] if ours_full else []) + (["ours_evict"] if eviction else []) + (["stock"] if stock is not None else [])
    n_llama = len(llama_rows) if llama else 0
    out: Dict[str, dict] = {}
    bar = tqdm(total=len(contexts) * repetitions * (len(names) + n_llama), desc="speed", unit="run",
               disable=not progress)
    for ctx in contexts:
        ids = essay_tokens(tokenizer, ctx)
        runners = {"ours": lambda: ours_run(ids, n_decode, None),
                   "ours_evict": lambda: ours_run(ids, n_decode, eviction),
                   "stock": lambda: time_run(stock, ids, n_decode)}
        runners = {n: runners[n] for n in names}
        peers = llama(ctx + n_decode + 8) if llama else {}
        try:
            for name, peer in peers.items():
                runners[name] = (lambda p: lambda: time_run(p, ids, n_decode))(peer)
            # One untimed warm-up: first-use resizes of MNN's graphs are not steady state.
            ours_run(ids[:64], 4, None)
            for peer in ([stock] if stock is not None else []) + list(peers.values()):
                time_run(peer, ids[:64], 4)
            runs = interleave(runners, repetitions, on_run=lambda *_: bar.update(1))
            row: Dict[str, dict] = {"context": ctx, "n_decode": n_decode, "repetitions": repetitions}
            for name, rs in runs.items():
                row[name] = {k: summarize([r[k] for r in rs]) for k in ("prefill_tps", "decode_tps")}
                if name in ("ours", "ours_evict"):
                    for phase in ("prefill_ms", "decode_ms"):
                        row[name][phase] = {k: summarize([r[phase][k] for r in rs])["median"] for k in SPLIT_KEYS}
                    row[name]["runs"] = [{p: r[p] for p in ("prefill_ms", "decode_ms")} for r in rs]
                    row[name]["kv_bytes_held"] = rs[-1]["kv_bytes_held"]
            if peers:
                _llama_rows(row, peers, ids, ctx)
            if peers and measure_quality:
                _quality(row, ours, eviction, peers, essay_tokens(tokenizer, ctx + n_decode), ctx, quality)
        finally:
            for peer in peers.values():
                peer.close()
        for a, b in (("ours", "stock"), ("ours_evict", "ours"), ("ours_evict", "stock")):
            if a in row and b in row:
                for k in ("prefill_tps", "decode_tps"):
                    row[f"{k[:-4]}_ratio_{a}_vs_{b}"] = row[a][k]["median"] / row[b][k]["median"]
        best = {k: max((n for n in LLAMA_ROWS if n in row), key=lambda n: row[n][k]["median"], default=None)
                for k in ("prefill_tps", "decode_tps")}
        for a in ("ours", "ours_evict", "stock"):
            for k, b in best.items():
                if a in row and b:
                    row[f"{k[:-4]}_ratio_{a}_vs_llama_best"] = row[a][k]["median"] / row[b][k]["median"]
                    row[f"{k[:-4]}_llama_best"] = b
        out[str(ctx)] = row
    bar.close()
    ours.configure_eviction(None)
    return out


def _llama_rows(row: dict, peers: dict, ids: Sequence[int], ctx: int) -> None:
    """KV bytes and what went in: llama.cpp's own record of the prompt must be our token ids."""
    from .llama_peer import ids_digest

    row["prompt_ids_sha256"] = ids_digest(ids)
    for name, peer in peers.items():
        fed = peer.tokens_in()[:ctx]
        if fed != list(ids):
            raise RuntimeError(f"{name}: llama.cpp evaluated other token ids than the prompt's")
        row[name].update({"kv_bytes_held": peer.kv_buffer_bytes, "kv_buffer_logged_mib": peer.kv_buffer_logged_mib,
                          "n_ctx": peer.n_ctx, "threads": peer.threads, "flash_attn": peer.flash_attn,
                          "type_k": peer.type_k, "type_v": peer.type_v, "fed_ids_sha256": ids_digest(fed)})


def _quality(row: dict, ours, eviction, peers: dict, ids: Sequence[int], ctx: int, quality) -> None:
    """Each compressing candidate against its own full cache, teacher-forced after the prompt:
    ``quality_vs_own_full`` (llama.cpp: vs its f16 cache without flash attention) and, per
    reference, ``quality_vs`` {reference: metrics}."""
    from .llama_peer import QUALITY_PAIRS, REFERENCE

    prompt, cont = ids[:ctx], ids[ctx:]
    logp = {}

    def lp(name):
        if name not in logp:
            logp[name] = teacher_forced_logp(peers[name], prompt, cont)
        return logp[name]

    for name, ref in QUALITY_PAIRS:
        if name in peers and ref in peers:
            q = dict(quality(lp(ref), lp(name), cont), reference=ref, tokens=len(cont))
            row[name].setdefault("quality_vs", {})[ref] = q
            if ref == REFERENCE:
                row[name]["quality_vs_own_full"] = q
    if eviction and "ours_evict" in row:
        ours.configure_eviction(None)
        ref = teacher_forced_logp(ours, prompt, cont)
        ours.configure_eviction(eviction)
        q = dict(quality(ref, teacher_forced_logp(ours, prompt, cont), cont), reference="ours", tokens=len(cont))
        ours.configure_eviction(None)
        row["ours_evict"]["quality_vs_own_full"] = q
        row["ours_evict"]["quality_vs"] = {"ours": q}


ENGINES = ("ours", "ours_evict", "stock") + LLAMA_ROWS


def format_table(results: Dict[str, dict]) -> str:
    f = lambda s: f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"
    with_llama = any(n in r for r in results.values() for n in LLAMA_ROWS)
    head = ["context", "engine", "prefill tok/s", "decode tok/s", "prefill ms/token: layers / cache step / glue",
            "decode ms/token: layers / cache step / glue", "KV MiB held"]
    if with_llama:
        head.append("KL / top-1 vs own full cache")
    head += ["prefill vs stock", "decode vs stock", "decode vs ours full"]
    if with_llama:
        head += ["prefill vs llama.cpp best", "decode vs llama.cpp best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ctx, r in results.items():
        for name in ENGINES:
            if name not in r:
                continue
            e = r[name]
            split = lambda d: (f"{d['mnn'] + d.get('dense', 0.0):.2f} / {d['attention'] + d['policy']:.2f} / "
                               f"{d['convert'] + d['glue']:.2f}") if d else ""
            kv = f"{e['kv_bytes_held'] / 2**20:.1f}" if "kv_bytes_held" in e else ""
            vs = lambda k, b: f"{r[f'{k}_ratio_{name}_vs_{b}']:.2f}x" if f"{k}_ratio_{name}_vs_{b}" in r else ""
            cells = [ctx, name, f(e["prefill_tps"]), f(e["decode_tps"]), split(e.get("prefill_ms")),
                     split(e.get("decode_ms")), kv]
            if with_llama:
                cells.append("; ".join(f"{q['kl']:.4f} / {q['top1_agreement']:.1%} (vs {ref})"
                                       for ref, q in e.get("quality_vs", {}).items()))
            cells += [vs("prefill", "stock"), vs("decode", "stock"), vs("decode", "ours")]
            if with_llama:
                cells += [vs("prefill", "llama_best"), vs("decode", "llama_best")]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("tokens/s: median over the repetitions (min-max). ms/token (ours): medians, split into the "
                 "layers' dense math (MNN module forwards; a decode token's native layers, runtime.decode_layers) "
                 "/ our native cache step (append, attention, eviction) / the rest (numpy <-> MNN copies, Python; "
                 "the head apart); the finer split: python -m mnn_h2o.tools.decode_profile.")
    if with_llama:
        lines.append("llama.cpp best: the llama.cpp config with the highest median (prefill and decode "
                     "separately). llama.cpp KV MiB: its context's KV buffer, allocated whole for n_ctx = "
                     "the run's tokens rounded up to 256. KL / top-1: mean KL(full || row) and top-1 "
                     "agreement over the decode-length essay tokens after the prompt, teacher-forced.")
    return "\n".join(lines)
