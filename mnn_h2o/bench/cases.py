"""The cases of the bench round, and one run of each.

Runtime cases (``bench.cases``): ``baseline`` is the full cache (no eviction, no compression);
``evict`` is the config's eviction alone (lossless off); ``probe``, ``full`` and ``store`` are
that eviction plus that lossless mode; ``q8`` is the full cache with int8 K and V rows (the
config's runtime.kv_dtype when it is an int8 type, q8 or q8r, else q8), and ``q8_evict`` the
config's eviction over them (eviction.target_lossy_ratio is whole-model against f16 rows: int8 rows
pay 32/17 of it). The baseline is always f16; the other cases use runtime.kv_dtype if it is a
float type, else f16 (see ``case_kv_dtype``): the lossless figures of the round are those of float
rows, although the store takes quantised rows too. A run
prefills a prompt of essay text and then feeds the true continuation token by token through the
decode path (teacher forcing), so the decode is timed exactly as in generation and every case
sees the same tokens: quality (KL, top-1 agreement vs the baseline) comes from the same runs as
speed and memory. Every case holds a context of its own, and their decode steps are interleaved
one token at a time (``run_interleaved``): a case's speed relative to the baseline is a ratio of
paired steps that saw the same load, which a busy machine barely moves.

Demo cases (``bench.demo_cases``): real prompts (an essay excerpt and a question, in the chat
template) in buckets of prompt length, greedy generation; reported per bucket.
"""
from __future__ import annotations

import hashlib
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..measure import log_softmax

LOSSLESS_CASES = ("probe", "full", "store")
EVICT_CASES = ("evict",) + LOSSLESS_CASES  # eviction on: the same KV values, so the same logits
# Cases with an element type of their own. The baseline, the reference of every quality figure,
# is the f16 full cache whatever the config says; the others use runtime.kv_dtype when it is a
# float type, else f16: the round's lossless cases (and evict, their bit-identical reference)
# measure the store on float rows, the rows its lossless target was set for. The store takes q8
# rows too (tests/test_engine_store.py), at a smaller ratio (docs/kv_cache.md "Lossless store").
# The int8 cases take the config's int8 rows (the default's q8r), so the round measures what runs.
INT8_CASES = ("q8", "q8_evict")


def case_kv_dtype(cfg: dict, case: str) -> str:
    from ..config import INT8_KV, QUANTISED_KV

    dt = cfg["runtime"]["kv_dtype"]
    if case == "baseline":
        return "f16"
    if case in INT8_CASES:
        return dt if dt in INT8_KV else "q8"
    return "f16" if dt in QUANTISED_KV else dt
DEMO_QUESTION = "\n\nIn two sentences, what is the main point of the text above?"


def case_sections(cfg: dict, case: str):
    """(eviction section or None, lossless section or None) of a case."""
    if case in ("baseline", "q8"):
        return None, None
    eviction = dict(cfg["eviction"], enabled=True)
    return eviction, (dict(cfg["lossless"], mode=case) if case in LOSSLESS_CASES else None)


def configure(llm, cfg: dict, case: str) -> None:
    eviction, lossless = case_sections(cfg, case)
    kv_dtype = case_kv_dtype(cfg, case)
    if kv_dtype != llm.kv_dtype:
        llm.configure_kv_dtype(kv_dtype)
    llm.configure_eviction(eviction)
    llm.configure_lossless(lossless)


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap() -> None:
    """Give free heap pages back to the OS (glibc malloc_trim), so that an RSS delta measures
    memory a run really took rather than heap that an earlier run left mapped."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def store_summary(stats: Optional[dict]) -> dict:
    """The store counters the report uses, whole model (zeros when the store is off)."""
    if not stats:
        return {"lossless_ratio": 0.0, "fallbacks": 0, "fallback_reasons": {}, "mismatches": 0}
    reasons = {k: v for k, v in stats.get("fallbacks", {}).items() if v}
    # A chunk that does not compress stays raw by design; the others are errors.
    errors = sum(v for k, v in reasons.items() if k != "incompressible")
    keep = {k: v for k, v in stats.items() if not isinstance(v, (list, dict))}
    return dict(keep, fallbacks=errors, fallback_reasons=reasons,
                lossless_ratio=stats.get("lossless_ratio", 0.0), mismatches=stats.get("verify_mismatches", 0))


def case_config(cfg: dict, case: str) -> dict:
    """The configuration of a case's context (``Llm.new_context``): its element type, eviction
    and lossless sections; the rest is the round's."""
    eviction, lossless = case_sections(cfg, case)
    return dict(cfg, runtime=dict(cfg["runtime"], kv_dtype=case_kv_dtype(cfg, case)),
                eviction=eviction or dict(cfg["eviction"], enabled=False), lossless=lossless or dict(cfg["lossless"], mode="off"))


def _settled_step(llm, fn):
    """``fn()`` and then the lossless store's jobs under way: the interleaved candidates take
    turns on the same cores, so work a store would finish in the background must not land in
    the next candidate's step."""
    out = fn()
    if llm.lossless is not None:
        llm.cache.drain_store()
    return out


def run_interleaved(llm, configs: Dict[str, dict], prompt: Sequence[int], continuation: Sequence[int],
                    repetitions: int, keep_logp: Sequence[str] = (), trace: bool = False,
                    on_run: Optional[Callable[[str], None]] = None, interleave_steps: bool = True):
    """Each candidate (``configs``: name -> configuration of its context) prefills ``prompt`` in a
    context of its own, then all of them decode ``continuation`` teacher-forced with their steps
    interleaved one token at a time (the order rotating), so a busy machine slows every candidate
    alike; ``repetitions`` times, the prefill order alternating (``on_run(name)`` after each
    prefill, the longest part). Returns (metrics: name -> one dict
    per repetition, step_s: name -> one list of decode-step seconds per repetition, logp: name ->
    [n, vocab] log-probs of the first repetition for the names in ``keep_logp``).
    ``interleave_steps`` False: each candidate decodes the whole continuation in turn, for a
    candidate whose speed is background work (the store's prefetch) that interleaving would
    either hand to the others or make serial."""
    names = list(configs)
    n = len(continuation)
    metrics: Dict[str, List[dict]] = {c: [] for c in names}
    step_s: Dict[str, List[List[float]]] = {c: [] for c in names}
    logp: Dict[str, np.ndarray] = {}
    for rep in range(repetitions):
        first = rep == 0
        contexts, logits, m = {}, {}, {}
        for name in (names if rep % 2 == 0 else names[::-1]):
            trim_heap()
            rss_idle = rss_bytes()
            ctx = llm.new_context(configs[name])
            with llm.using(ctx):
                t0 = time.perf_counter()
                logits[name] = _settled_step(llm, lambda: llm.prefill(prompt))
                t1 = time.perf_counter()
            m[name] = {"prefill_tps": len(prompt) / (t1 - t0), "rss_idle_bytes": rss_idle,
                       "rss_delta_bytes": rss_bytes() - rss_idle}
            contexts[name] = ctx
            if on_run:
                on_run(name)
        digest = {c: hashlib.sha256() for c in names}
        times = {c: [] for c in names}
        points: Dict[str, List[List[int]]] = {c: [] for c in names}
        if first:
            logp.update({c: np.empty((n, llm.config.vocab), np.float32) for c in keep_logp})

        def note(name):
            st = llm.stats
            points[name].append([llm.pos, st.kv_bytes_held, st.kv_bytes_kept, st.kv_bytes_uncompressed])

        if first and trace:
            for name in names:
                with llm.using(contexts[name]):
                    note(name)
        def step(name, i, t, settle):
            with llm.using(contexts[name]):
                digest[name].update(np.ascontiguousarray(logits[name], dtype=np.float32).tobytes())
                if first and name in logp:
                    logp[name][i] = log_softmax(logits[name])
                t0 = time.perf_counter()
                logits[name] = _settled_step(llm, lambda: llm.decode(int(t))) if settle else llm.decode(int(t))
                times[name].append(time.perf_counter() - t0)
                if first and trace:
                    note(name)

        if interleave_steps:
            for i, t in enumerate(continuation):
                k = i % len(names)
                for name in names[k:] + names[:k]:
                    step(name, i, t, True)
        else:
            for name in names:
                for i, t in enumerate(continuation):
                    step(name, i, t, False)
        for name in names:
            with llm.using(contexts[name]):
                st = llm.stats
                r = dict(m[name], decode_tps=n / sum(times[name]) if n else 0.0,
                         kv_bytes_held=st.kv_bytes_held, kv_bytes_pool=st.kv_bytes_pool,
                         kv_bytes_kept=st.kv_bytes_kept, kv_bytes_peak=st.kv_bytes_peak,
                         kv_bytes_uncompressed=st.kv_bytes_uncompressed, lossy_ratio=st.lossy_ratio,
                         total_ratio=st.total_ratio, whole_model_ratio=st.whole_model_ratio,
                         lossy_ratio_decode_avg=st.lossy_ratio_decode_avg, evictions=st.evictions,
                         reconstruct_s=st.reconstruct_s,  # kvzip's pass: its part of the prefill's time
                         rss_bytes=rss_bytes(), logits_sha256=digest[name].hexdigest(),
                         store=store_summary(llm.store_stats()))
            if first and trace:
                r["trace"] = points[name]
            metrics[name].append(r)
            step_s[name].append(times[name])
        contexts.clear()  # the KV memory goes back before the next repetition
    return metrics, step_s, logp


def quality(base_logp: np.ndarray, logp: np.ndarray, continuation: Sequence[int]) -> dict:
    """KL(baseline || case), top-1 agreement and perplexities of the true continuation."""
    p = np.exp(base_logp.astype(np.float64))
    kl = float(np.mean(np.sum(p * (base_logp - logp), axis=-1)))
    agree = float(np.mean(base_logp.argmax(-1) == logp.argmax(-1)))
    # logp[i] is the distribution after the prompt and continuation[:i]: it predicts continuation[i].
    idx, nxt = np.arange(len(continuation)), np.asarray(continuation)
    ppl = float(np.exp(-logp[idx, nxt].astype(np.float64).mean()))
    ppl_base = float(np.exp(-base_logp[idx, nxt].astype(np.float64).mean()))
    return {"kl": kl, "top1_agreement": agree, "ppl": ppl, "ppl_baseline": ppl_base}


def demo_prompt(tokenizer, bucket: int, offset: int) -> List[int]:
    """About ``bucket`` tokens: an essay excerpt and a question, in the chat template."""
    from ..essays import essay_tokens

    overhead = len(tokenizer.encode(tokenizer.apply_chat_template("x" + DEMO_QUESTION))) - 1
    n = max(8, bucket - overhead)
    excerpt = tokenizer.decode(essay_tokens(tokenizer, n, offset))
    ids = tokenizer.encode(tokenizer.apply_chat_template(excerpt + DEMO_QUESTION))
    return ids


def run_demo(llm, prompt: Sequence[int], new_tokens: int) -> dict:
    llm.reset()
    g = llm.generate(list(prompt), max_new_tokens=new_tokens)
    st = g.stats
    store = store_summary(llm.store_stats())
    return {"prompt_tokens": len(prompt), "generated_tokens": len(g.token_ids),
            "prefill_tps": st.prefill_tps, "decode_tps": st.decode_tps,
            "kv_bytes_held": st.kv_bytes_held, "kv_bytes_pool": st.kv_bytes_pool,
            "kv_bytes_kept": st.kv_bytes_kept, "kv_bytes_uncompressed": st.kv_bytes_uncompressed, "lossy_ratio": st.lossy_ratio,
            "total_ratio": st.total_ratio, "rss_bytes": rss_bytes(), "token_ids": g.token_ids,
            "text": g.text, "store": store}


def compare_answer(ref: dict, r: dict) -> dict:
    """Agreement of a demo generation ``r`` with the baseline's ``ref``."""
    from .similarity import first_divergence, rouge_l, token_f1

    div = first_divergence(ref["token_ids"], r["token_ids"])
    return {"same_prefix_tokens": min(len(ref["token_ids"]), len(r["token_ids"])) if div is None else div,
            "first_divergence": div, "identical_to_baseline": div is None,
            "token_f1": token_f1(ref["text"], r["text"]), "rouge_l": rouge_l(ref["text"], r["text"])}


def run_cases(llm, tokenizer, cfg: dict, progress=None) -> List[dict]:
    """Every runtime case at every prompt length, their decode steps interleaved token by token
    (``run_interleaved``); each case's decode speed relative to the baseline's is measured on
    those pairs (``decode_vs_baseline``)."""
    from ..essays import essay_tokens
    from ..measure import RATIO_BLOCK_STEPS, paired_ratio, summarize

    b = cfg["bench"]
    cases = list(dict.fromkeys(["baseline"] + b["cases"]))  # quality needs the baseline
    n_dec = b["decode_tokens"]
    block = min(RATIO_BLOCK_STEPS, max(1, n_dec // 2))
    rows: List[dict] = []
    longest = max(b["prompt_lengths"])
    for plen in b["prompt_lengths"]:
        ids = essay_tokens(tokenizer, plen + n_dec)
        prompt, cont = ids[:plen], ids[plen:]
        runs, steps, logp = run_interleaved(
            llm, {c: case_config(cfg, c) for c in cases}, prompt, cont, b["repetitions"],
            keep_logp=[c for c in cases if c in ("baseline", *EVICT_CASES, *INT8_CASES)], trace=plen == longest,
            on_run=(lambda c: progress(c, plen)) if progress else None)
        for case in cases:
            ms = runs[case]
            m0 = ms[0]
            row = {"case": case, "prompt_tokens": plen, "decode_tokens": n_dec,
                   "decode_tps": summarize([m["decode_tps"] for m in ms]),
                   "decode_vs_baseline": paired_ratio(steps["baseline"], steps[case], block),
                   "prefill_tps": summarize([m["prefill_tps"] for m in ms])}
            for k in ("kv_bytes_held", "kv_bytes_pool", "kv_bytes_kept", "kv_bytes_peak", "kv_bytes_uncompressed",
                      "lossy_ratio", "total_ratio", "whole_model_ratio", "lossy_ratio_decode_avg", "evictions",
                      "logits_sha256"):
                row[k] = m0[k]
            row["rss_delta_bytes"] = summarize([m["rss_delta_bytes"] for m in ms])
            row["rss_bytes"] = max(m["rss_bytes"] for m in ms)
            row["store"] = m0["store"]
            row["store"]["fallbacks"] = max(m["store"]["fallbacks"] for m in ms)
            row["store"]["mismatches"] = max(m["store"]["mismatches"] for m in ms)
            if "trace" in m0:
                row["trace"] = m0["trace"]
            row.update(quality(logp["baseline"], logp[case], cont))
            rows.append(row)
    return rows


def run_demos(llm, tokenizer, cfg: dict, progress=None) -> List[dict]:
    b = cfg["bench"]
    rows = []
    for i, bucket in enumerate(b["demo_buckets"]):
        prompt = demo_prompt(tokenizer, bucket, offset=20000 + 5000 * i)
        ref = None
        for case in ["baseline"] + [c for c in b["demo_cases"] if c != "baseline"]:
            configure(llm, cfg, case)
            r = run_demo(llm, prompt, b["demo_new_tokens"])
            if ref is None:
                ref = r
            r.update(case=case, bucket=bucket, **compare_answer(ref, r))
            rows.append(r)
            if progress:
                progress(case, bucket)
    return rows

