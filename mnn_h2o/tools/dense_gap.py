"""What MNN's dense part of a decode token costs back to back, and what it costs in the engine's
rhythm, where each layer's module waits while our cache step runs.

One decode token of the export (every layer module, the tail and lm_head: for SmolLM2 the
engine's 31 ``Module.forward`` calls and its native 8-bit head, 32 calls with runtime.lm_head mnn)
is run in three ways, interleaved token by token:

    back-to-back  the calls one after another, nothing between them
    spin          a busy wait on the calling thread between layer calls, as long as the real
                  cache step's median: time passes, no memory is touched, no thread is woken
    cache step    the engine's own native cache step between layer calls (append, attention over
                  a cache prefilled with --context tokens), as a real decode token runs it

Only the MNN calls are timed (forward and reading q/k/v, as ``Llm._layers`` times them), so
the difference between the rows is what the work between calls costs MNN's next call: the
second core's MNN worker going idle and being woken, and caches refilled. The cache grows by one
token per measured "cache step" token. It also lists which x86 kernel sets the MNN wheel holds
(its symbol names), which decides the speed of its int8/int4 matrix kernels.

    python -m mnn_h2o.tools.dense_gap [--context 512] [--tokens 200] [--config h2o.yaml]

Timing: run it on a quiet machine; medians (min-max) over the tokens.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import time

import numpy as np

MODES = ("back-to-back", "spin", "cache step")
WARMUP = 3  # untimed tokens per mode


def mnn_kernel_sets() -> str:
    """The x86 kernel families compiled into the MNN wheel, by the prefixes of their symbols."""
    import MNN

    site = os.path.dirname(os.path.dirname(MNN.__file__))
    libs = glob.glob(os.path.join(site, "_mnncengine*.so"))
    if not libs:
        return "unknown (no _mnncengine library found)"
    with open(libs[0], "rb") as f:
        data = f.read()
    counts = {name: len(set(re.findall(prefix + rb"MNN\w+", data)))
              for name, prefix in (("SSE", rb"_SSE_"), ("AVX2", rb"_AVX_"), ("AVX-512", rb"_AVX512_"))}
    return ", ".join(f"{name} {n} kernels" for name, n in counts.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--context", type=int, default=512, help="tokens in the cache the step attends to (default 512)")
    ap.add_argument("--tokens", type=int, default=200, help="measured tokens per mode (default 200)")
    args = ap.parse_args(argv)
    if args.context < 1 or args.tokens < 3:
        ap.error("--context must be >= 1 and --tokens >= 3")
    from ..cli_errors import run

    return run(lambda: _measure(args))


def _measure(args) -> int:
    from .. import config as config_mod
    from ..engine import Llm
    from ..forward_paths import LayerRows

    cfg = config_mod.load(args.config, {"runtime.prompt_layers": "mnn"})  # the MNN modules it times
    llm = Llm.load(None, cfg, progress=False)
    c, mods, perf = llm.config, llm._modules, time.perf_counter
    if args.context + WARMUP + args.tokens > llm.max_context:
        raise ValueError(f"--context + --tokens must stay below the context limit {llm.max_context}")
    rng = np.random.default_rng(0)
    llm.prefill([int(t) for t in rng.integers(100, c.vocab // 2, args.context)])
    inputs = llm._inputs
    h_in, attn_in, cos_in, sin_in, attn = inputs.vars(1)
    h_in.write(inputs.embedding([100]))
    cos, sin = inputs.rope(args.context, 1)
    cos_in.write(cos[:, None, :])
    sin_in.write(sin[:, None, :])
    attn[:] = 0.0
    attn_in.write(attn)
    step_s = [0.0]

    def token(mode: str) -> tuple[float, float]:
        """One token's MNN seconds (forwards + reads) and its cache-step seconds."""
        t_mnn = t_step = 0.0
        h = h_in
        for i in range(c.n_layers):
            t0 = perf()
            h, q, k, v = mods[f"layer{i}"].forward([h, cos_in, sin_in] if i == 0 else [h, attn_in, cos_in, sin_in])
            q, k, v = q.read(), k.read(), v.read()
            t1 = perf()
            t_mnn += t1 - t0
            if mode == "spin":
                end = t1 + step_s[0]
                while perf() < end:
                    pass
            elif mode == "cache step":
                llm.cache.step(i, q, k, v, attn)
                t_step += perf() - t1
        t0 = perf()
        llm._head_path.logits(LayerRows(h, attn, attn_in), slice(0, 1), llm.stats)  # as the engine runs them
        return t_mnn + perf() - t0, t_step

    for mode in MODES[::-1]:  # warm-up, the cache step first: its length is the spin's
        for _ in range(WARMUP):
            _, s = token(mode)
        if mode == "cache step":
            step_s[0] = s / c.n_layers
    mnn = {m: [] for m in MODES}
    steps = []
    for t in range(args.tokens):
        order = MODES if t % 2 == 0 else MODES[::-1]
        for mode in order:
            m, s = token(mode)
            mnn[mode].append(m * 1e3)
            if mode == "cache step":
                steps.append(s * 1e3)
                step_s[0] = statistics.median(steps) / c.n_layers / 1e3
    base = statistics.median(mnn["back-to-back"])
    print(f"model {cfg['model']['name']}, weights {llm.weights}, {cfg['runtime']['threads']} threads, memory "
          f"{cfg['runtime']['memory']}, KV {llm.kv_dtype}, {c.n_layers} layers + tail + lm_head per token, "
          f"cache of {args.context} tokens; {args.tokens} tokens per mode, interleaved")
    print(f"MNN wheel's x86 kernel sets: {mnn_kernel_sets()}")
    print("| between layer calls | MNN ms/token | vs back-to-back |")
    print("|---|---:|---:|")
    for mode in MODES:
        v = mnn[mode]
        med = statistics.median(v)
        what = {"spin": f"spin {statistics.median(steps) / c.n_layers * 1e3:.0f} us",
                "cache step": f"cache step ({statistics.median(steps):.2f} ms/token)"}.get(mode, mode)
        print(f"| {what} | {med:.2f} ({min(v):.2f}-{max(v):.2f}) | {med / base:.2f}x |")
    print("MNN ms/token: the 32 Module.forward calls with their q/k/v reads, median (min-max) over the tokens.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
