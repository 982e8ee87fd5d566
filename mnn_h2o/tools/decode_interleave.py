"""Decode speed of several cache configurations against each other, steps interleaved token by token.

Each engine (KV element type and eviction policy) is prefilled with the same essay prompt; then
their decode steps rotate (A B C, B C A, C A B, ...) over the same teacher-forced tokens, so slow
drifts of a noisy machine hit all alike. Prints per engine the ms per token (median, mean), the
part spent in our native cache step (append + attention + policy), the KV bytes held and the
whole-model ratio, and the speed-up over the first engine: ratio of means, and its median and
range over blocks of 50 tokens.

    python -m mnn_h2o.tools.decode_interleave [--model M] [--context 4096] [--tokens 400]
        [--engines f16:none q8:none f16:h2o q8:h2o@6 f16:h2o+4/8 q8:h2o~normal q8:none^mnn
                   q8:none^native/mnn q8:none^native/native/mnn]
        [--llama llama_f16 llama_f16_fa llama_q8_fa] [--json FILE]

--llama adds llama.cpp peers (bench.llama_peer's configs, the same GGUF and prompt ids, the
`llama` extra) to the rotation, and each of our engines' speed-up over the fastest of them
(measure.paired_ratio over blocks of 16 steps, with its 95% noise). This is the long-context
measurement: every engine prefills once (that one prefill's time is printed, a single sample,
not a prefill benchmark: use prefill_interleave for that), so 16K-32K tokens fit in one run.

An engine is DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL[/DECODE_LAYERS]]]: DTYPE a
runtime.kv_dtype, POLICY none or an eviction.policy, RATIO its eviction.target_lossy_ratio (whole-model; default the config's), the
weight bits of its export as `eval weights` spells them (default the config's; 4/8 = 4-bit
layers with an 8-bit lm_head), MEMORY its runtime.memory (default the config's; normal =
float activations), LM_HEAD its runtime.lm_head, TAIL its runtime.tail and DECODE_LAYERS its
runtime.decode_layers and runtime.prompt_layers (native or mnn; default the config's; LM_HEAD alone sets the tail too).
"""
import argparse
import copy
import hashlib
import sys
import time

import numpy as np
from tqdm import tqdm

from .. import config as config_mod
from ..config import load
from ..engine import Llm
from ..export import ensure_exported
from ..essays import essay_tokens
from ..measure import RATIO_BLOCK_STEPS, paired_ratio


def parse_weights(spec: str, text: str, cfg: dict):
    """(weight_bits, head_bits) of '4/8' / '8' (eval weights' LAYERS[/HEAD] spelling) or '' (the
    config's)."""
    if not text:
        return cfg["model"]["weight_bits"], cfg["model"]["head_bits"]
    from ..eval.weights import parse_variants
    from ..export import WEIGHT_BITS

    try:
        (bits,) = parse_variants(text, WEIGHT_BITS)
    except ValueError as e:
        raise SystemExit(f"{spec}: {e}") from None
    return bits


def parse_engine(spec: str, cfg: dict):
    """(label, eviction section or None, kv_dtype, (weight_bits, head_bits), memory, (lm_head, tail,
    decode_layers)) of DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL[/DECODE_LAYERS]]]."""
    head_spec, _, end = spec.partition("^")
    parts = end.split("/") if end else []
    if len(parts) > 3:
        raise SystemExit(f"{spec}: at most LM_HEAD/TAIL/DECODE_LAYERS after ^")
    if len(parts) == 1:  # LM_HEAD alone sets the tail too
        parts.append(parts[0])
    names = ("lm_head", "tail", "decode_layers")
    ends = tuple(parts[i] if i < len(parts) and parts[i] else cfg["runtime"][n] for i, n in enumerate(names))
    for name, value in zip(names, ends):
        if value not in config_mod.key(f"runtime.{name}").choices:
            raise SystemExit(f"{spec}: unknown runtime.{name} {value!r}")
    rest_spec, _, memory = head_spec.partition("~")
    memory = memory or cfg["runtime"]["memory"]
    if memory not in config_mod.key("runtime.memory").choices:
        raise SystemExit(f"{spec}: unknown runtime.memory {memory!r}")
    body, _, weights_text = rest_spec.partition("+")
    weights = parse_weights(spec, weights_text, cfg)
    dtype, _, rest = body.partition(":")
    policy, _, ratio = rest.partition("@")
    if dtype not in config_mod.key("runtime.kv_dtype").choices:
        raise SystemExit(f"{spec}: unknown kv dtype {dtype!r}")
    if policy == "none":
        return spec, None, dtype, weights, memory, ends
    if policy not in config_mod.key("eviction.policy").choices:
        raise SystemExit(f"{spec}: unknown policy {policy!r}")
    eviction = dict(copy.deepcopy(cfg["eviction"]), enabled=True, policy=policy)
    if ratio:
        eviction.update(target_keep_ratio=0.0, target_lossy_ratio=float(ratio))
    return spec, eviction, dtype, weights, memory, ends


def check_llama_configs(names) -> None:
    """SystemExit naming any --llama config that bench.llama_peer does not know."""
    if names:
        from ..bench.llama_peer import CONFIGS

        bad = [n for n in names if n not in CONFIGS]
        if bad:
            raise SystemExit(f"--llama: unknown config(s) {', '.join(bad)}: use {', '.join(CONFIGS)}")


def make_engines(cfg: dict, specs) -> list:
    """(label, Llm) of each parse_engine spec, eviction configured."""
    engines = []
    for label, eviction, dtype, (weight_bits, head_bits), memory, (lm_head, tail, decode_layers) in specs:
        c = copy.deepcopy(cfg)
        c["runtime"].update(kv_dtype=dtype, memory=memory, lm_head=lm_head, tail=tail, decode_layers=decode_layers,
                            prompt_layers=decode_layers)
        c["model"].update(weight_bits=weight_bits, head_bits=head_bits)
        llm = Llm(ensure_exported(c["model"], progress=False), c)
        llm.configure_eviction(eviction)
        engines.append((label, llm))
    return engines


# After a llama.cpp step its OpenMP threads spin on for a while (libgomp's default wait policy)
# and take the cores from whatever runs next: the engine after llama.cpp's in the rotation measured
# ~5 ms a token slower (of 12-13, Gemma 3 270M), whichever engine it was. An untimed pause lets
# them go to sleep first (docs/notebook/gemma3.md).
LLAMA_SETTLE_S = 0.02


def _step(engine, token: int) -> tuple:
    """(seconds, of them our native cache step's) of one decode step."""
    a0 = engine.stats.attention_s if isinstance(engine, Llm) else 0.0
    t0 = time.perf_counter()
    engine.decode(token)
    t = time.perf_counter() - t0
    if not isinstance(engine, Llm):
        time.sleep(LLAMA_SETTLE_S)
    return t, (engine.stats.attention_s - a0 if isinstance(engine, Llm) else 0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--model", help="named model or GGUF path (default: the config's model.name)")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--tokens", type=int, default=400, help="decode steps per engine (default 400)")
    ap.add_argument("--engines", nargs="+", default=["f16:none", "f16:h2o"],
                    help="DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL[/DECODE_LAYERS]]] per "
                         "engine; speed-ups are against the first (default f16:none f16:h2o)")
    ap.add_argument("--llama", nargs="*", default=[], metavar="CONFIG",
                    help="llama.cpp peers in the rotation (bench.llama_peer.CONFIGS: llama_f16 llama_f16_fa "
                         "llama_q8_fa)")
    ap.add_argument("--json", help="also write the figures (every step's seconds included) to this file")
    args = ap.parse_args(argv)
    if args.tokens < 2 * RATIO_BLOCK_STEPS:
        raise SystemExit(f"--tokens must be at least {2 * RATIO_BLOCK_STEPS} (two blocks of the paired ratio)")
    check_llama_configs(args.llama)
    cfg = load(args.config, {"model.name": args.model} if args.model else None)
    cfg["lossless"]["mode"] = "off"
    engines = make_engines(cfg, [parse_engine(s, cfg) for s in args.engines])
    limit = min(llm.max_context for _, llm in engines)
    if args.context + args.tokens > limit:
        raise SystemExit(f"--context + --tokens: {args.context + args.tokens} tokens is past the context limit "
                         f"{limit} (runtime.max_context / the model's)")
    ours = len(engines)
    peers = {}
    if args.llama:
        from ..bench.llama_peer import make_peers
        from ..model_source import resolve_gguf

        peers = make_peers(resolve_gguf(cfg["model"]["name"]), args.context + args.tokens + 8,
                           cfg["runtime"]["threads"], args.llama)
        engines += list(peers.items())
    try:
        result = _run(engines, ours, cfg, args)
    finally:
        for p in peers.values():
            p.close()
    if args.json:
        import json

        from ..bench.environment import environment

        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "argv": argv if argv is not None else sys.argv[1:], **result}, f,
                      indent=1)
    return 0


def _run(engines, ours: int, cfg: dict, args) -> dict:
    tokenizer = engines[0][1].tokenizer
    ids = essay_tokens(tokenizer, args.context + args.tokens)
    prefill_s = []
    for label, engine in tqdm(engines, desc=f"prefill {args.context}", unit="engine"):
        engine.reset()
        t0 = time.perf_counter()
        engine.prefill(ids[:args.context])
        prefill_s.append(time.perf_counter() - t0)
        if not isinstance(engine, Llm) and engine.tokens_in() != list(ids[:args.context]):
            raise RuntimeError(f"{label}: llama.cpp evaluated other token ids than the prompt's")
    n = len(engines)
    times = [[] for _ in engines]
    native = [0.0] * n
    for i, token in enumerate(tqdm(ids[args.context:], desc="decode, interleaved", unit="step")):
        for j in range(n):
            e = (i + j) % n
            t, cache_s = _step(engines[e][1], int(token))
            times[e].append(t)
            native[e] += cache_s
    rows = {}
    for (label, engine), t, cache_s, p in zip(engines, times, native, prefill_s):
        row = {"prefill_s": p, "decode_ms_median": float(np.median(t)) * 1e3, "decode_ms_mean": float(np.mean(t)) * 1e3,
               "step_s": t}
        if isinstance(engine, Llm):
            st = engine.stats
            row.update(cache_ms=cache_s / len(t) * 1e3, kv_bytes_held=st.kv_bytes_held,
                       whole_model_ratio=st.whole_model_ratio, reconstruct_s=st.reconstruct_s)
        else:
            row.update(kv_bytes_held=engine.kv_buffer_bytes, flash_attn=engine.flash_attn, type_k=engine.type_k,
                       type_v=engine.type_v)
        row["vs_first"] = paired_ratio([times[0]], [t])
        rows[label] = row
    llama_best = min(engines[ours:], key=lambda e: rows[e[0]]["decode_ms_mean"])[0] if len(engines) > ours else None
    if llama_best:
        for label, _ in engines[:ours]:
            rows[label]["vs_llama_best"] = paired_ratio([rows[llama_best]["step_s"]], [rows[label]["step_s"]])
    print(f"{cfg['model']['name']}, {args.context}-token essay prompt (one prefill per engine), {args.tokens} decode "
          f"steps per engine, {cfg['runtime']['threads']} threads, interleaved")
    print(f"{'engine':>16} {'prefill s':>9} {'ms/token':>9} {'mean':>6} {'cache ms':>8} {'KV MiB':>7} {'ratio':>6} "
          f"{'vs first (95%)':>15}" + (f" {'vs ' + llama_best:>22}" if llama_best else ""))
    fmt = lambda r: f"{r['ratio']:.3f} ±{r['noise'] * 100:.1f}%"
    for label, _ in engines:
        r = rows[label]
        cache = f"{r['cache_ms']:>8.2f}" if "cache_ms" in r else f"{'':>8}"
        ratio = f"{r['whole_model_ratio']:>6.2f}" if "whole_model_ratio" in r else f"{'':>6}"
        print(f"{label:>16} {r['prefill_s']:>9.1f} {r['decode_ms_median']:>9.2f} {r['decode_ms_mean']:>6.2f} {cache} "
              f"{r['kv_bytes_held'] / 2**20:>7.1f} {ratio} {fmt(r['vs_first']):>15}"
              + (f" {fmt(r['vs_llama_best']):>22}" if "vs_llama_best" in r else ""))
    return {"model": cfg["model"]["name"], "context": args.context, "tokens": args.tokens,
            "threads": cfg["runtime"]["threads"], "prompt_ids_sha256": hashlib.sha256(
                np.asarray(ids[:args.context], np.int64).tobytes()).hexdigest(),
            "llama_best": llama_best, "engines": rows}


if __name__ == "__main__":
    raise SystemExit(main())
