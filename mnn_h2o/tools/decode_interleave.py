"""Decode speed of several cache configurations against each other, steps interleaved token by token.

Each engine (KV element type and eviction policy) is prefilled with the same essay prompt; then
their decode steps rotate (A B C, B C A, C A B, ...) over the same teacher-forced tokens, so slow
drifts of a noisy machine hit all alike. Prints per engine the ms per token (median, mean), the
part spent in our native cache step (append + attention + policy), the KV bytes held and the
whole-model ratio, and the speed-up over the first engine: ratio of means, and its median and
range over blocks of 50 tokens.

    python -m mnn_h2o.tools.decode_interleave [--context 4096] [--tokens 400]
        [--engines f16:none q8:none f16:h2o q8:h2o@6 f16:h2o+4/8 q8:h2o~normal q8:none^mnn
                   q8:none^native/mnn q8:none^native/native/mnn]

An engine is DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL[/DECODE_LAYERS]]]: DTYPE a
runtime.kv_dtype, POLICY none or an h2o.policy, RATIO its h2o.target_lossy_ratio (whole-model; default the config's), the
weight bits of its export as `eval weights` spells them (default the config's; 4/8 = 4-bit
layers with an 8-bit lm_head), MEMORY its runtime.memory (default the config's; normal =
float activations), LM_HEAD its runtime.lm_head, TAIL its runtime.tail and DECODE_LAYERS its
runtime.decode_layers and runtime.prompt_layers (native or mnn; default the config's; LM_HEAD alone sets the tail too).
"""
import argparse
import copy
import time

import numpy as np

from .. import config as config_mod
from ..config import load
from ..engine import Llm
from ..export import ensure_exported
from ..essays import essay_tokens


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
    """(label, h2o section or None, kv_dtype, (weight_bits, head_bits), memory, (lm_head, tail,
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
    if policy not in config_mod.key("h2o.policy").choices:
        raise SystemExit(f"{spec}: unknown policy {policy!r}")
    h2o = dict(copy.deepcopy(cfg["h2o"]), enabled=True, policy=policy)
    if ratio:
        h2o.update(target_keep_ratio=0.0, target_lossy_ratio=float(ratio))
    return spec, h2o, dtype, weights, memory, ends


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--tokens", type=int, default=400, help="decode steps per engine (default 400)")
    ap.add_argument("--engines", nargs="+", default=["f16:none", "f16:h2o"],
                    help="DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL[/DECODE_LAYERS]]] per "
                         "engine; speed-ups are against the first (default f16:none f16:h2o)")
    args = ap.parse_args()
    cfg = load(args.config)
    cfg["lossless"]["mode"] = "off"
    name = cfg["model"]["name"]
    specs = [parse_engine(s, cfg) for s in args.engines]
    engines = []
    for label, h2o, dtype, (weight_bits, head_bits), memory, (lm_head, tail, decode_layers) in specs:
        c = copy.deepcopy(cfg)
        c["runtime"].update(kv_dtype=dtype, memory=memory, lm_head=lm_head, tail=tail, decode_layers=decode_layers,
                            prompt_layers=decode_layers)
        c["model"].update(weight_bits=weight_bits, head_bits=head_bits)
        llm = Llm(ensure_exported(c["model"], progress=False), c)
        llm.configure_h2o(h2o)
        engines.append((label, llm))
    ids = essay_tokens(engines[0][1].tokenizer, args.context + args.tokens)
    for _, llm in engines:
        llm.reset()
        llm.prefill(ids[:args.context])
    n = len(engines)
    times = [[] for _ in engines]
    native = [0.0] * n
    for i, token in enumerate(ids[args.context:]):
        for j in range(n):
            e = (i + j) % n
            llm = engines[e][1]
            a0 = llm.stats.attention_s
            t0 = time.perf_counter()
            llm.decode(int(token))
            times[e].append(time.perf_counter() - t0)
            native[e] += llm.stats.attention_s - a0
    print(f"{name}, {args.context}-token prompt, {args.tokens} decode steps per engine, "
          f"{cfg['runtime']['threads']} threads, interleaved")
    print(f"{'engine':>16} {'ms/token':>9} {'mean':>6} {'cache ms':>8} {'KV MiB':>7} {'vs f16 x':>8} "
          f"{'speed-up (blocks of 50)':>26}")
    t_first = np.array(times[0])
    for (label, llm), t, cache_s in zip(engines, times, native):
        t = np.array(t)
        blocks = [t_first[i:i + 50].mean() / t[i:i + 50].mean() for i in range(0, len(t), 50)]
        up = f"{t_first.mean() / t.mean():.3f} ({np.median(blocks):.3f}, {min(blocks):.3f}-{max(blocks):.3f})"
        st = llm.stats
        print(f"{label:>16} {np.median(t) * 1e3:>9.2f} {t.mean() * 1e3:>6.2f} "
              f"{cache_s / len(t) * 1e3:>8.2f} {st.kv_bytes_held / 2**20:>7.1f} "
              f"{st.whole_model_ratio:>8.2f} {up:>26}")


if __name__ == "__main__":
    main()
