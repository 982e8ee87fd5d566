"""What one MNN Module.forward call costs from Python beyond its math, and so what the engine's
per-token calls (one per layer, plus the tail and lm_head) cost a decode token.

A stand-in module with the interface of the engine's layer modules (inputs h, attn [1, hidden],
cos, sin [1, 1, head_dim]; outputs h_out, q, k, v in their shapes) and next to no math (a few
element-wise ops on one row) runs on the engine's MNN runtime (the config's threads, memory mode
and dynamic quantisation), called the way the engine calls a layer module: forward, then read q, k
and v into numpy, then write the attention input. Its time per call is the fixed cost of a call;
the real layer module (layer 1 of the export, same inputs) is timed beside it, interleaved in
blocks, for scale.

    python -m mnn_h2o.tools.module_calls [--calls 3000] [--config h2o.yaml]

Timing, not counting: on a loaded machine take the minimum over blocks as the estimate.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

BLOCK = 100  # calls per timed block


def stand_in_module(F, cfg):
    """The stand-in graph: the layer modules' inputs and output shapes, a few element-wise ops."""
    H, hd = cfg.hidden, cfg.head_dim
    h = F.placeholder([-1, H]); h.name = "h"
    attn = F.placeholder([-1, H]); attn.name = "attn"
    cos = F.placeholder([-1, 1, hd]); cos.name = "cos"
    sin = F.placeholder([-1, 1, hd]); sin.name = "sin"
    h_out = h + attn
    heads = F.reshape(h_out, [-1, cfg.n_heads, hd]) * cos + sin
    q = heads
    k = F.reshape(h_out, [-1, cfg.n_heads, hd])
    k = F.slice(k, [0, 0, 0], [-1, cfg.n_kv_heads, hd])
    v = k * sin
    outs = [h_out, q, k, v]
    for var, name in zip(outs, ("h_out", "q", "k", "v")):
        var.name = name
    return outs


def timed_blocks(module, inputs, attn_in, attn, n_blocks):
    """Seconds per call of each block of BLOCK calls: forward, read q/k/v, write attn."""
    out = []
    for _ in range(n_blocks):
        t0 = time.perf_counter()
        for _ in range(BLOCK):
            h, q, k, v = module.forward(inputs)
            q, k, v = q.read(), k.read(), v.read()
            attn_in.write(attn)
        out.append((time.perf_counter() - t0) / BLOCK)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--calls", type=int, default=3000, help="calls per module (default 3000, in blocks of 100)")
    args = ap.parse_args(argv)
    if args.calls < BLOCK:
        ap.error(f"--calls must be >= {BLOCK}")
    from ..cli_errors import run

    return run(lambda: _measure(args))


def _measure(args) -> int:
    from .. import config as config_mod
    from ..engine import Llm, runtime_manager
    from ..mnn_runtime import import_mnn

    cfg = config_mod.load(args.config, {"runtime.prompt_layers": "mnn"})  # the export's layer modules
    llm = Llm.load(None, cfg, progress=False)
    c = llm.config
    MNN = import_mnn()
    F = MNN.expr
    manager = runtime_manager(cfg["runtime"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stand_in.mnn")
        F.save(stand_in_module(F, c), path)
        stand_in = MNN.nn.load_module_from_file(path, ["h", "attn", "cos", "sin"], ["h_out", "q", "k", "v"],
                                                runtime_manager=manager)
    rng = np.random.default_rng(0)
    h_in, attn_in = F.placeholder([1, c.hidden]), F.placeholder([1, c.hidden])
    cos_in, sin_in = F.placeholder([1, 1, c.head_dim]), F.placeholder([1, 1, c.head_dim])
    h_in.write(rng.standard_normal((1, c.hidden), dtype=np.float32))
    attn = rng.standard_normal((1, c.hidden), dtype=np.float32)
    attn_in.write(attn)
    cos_in.write(np.ones((1, 1, c.head_dim), np.float32))
    sin_in.write(np.zeros((1, 1, c.head_dim), np.float32))
    inputs = [h_in, attn_in, cos_in, sin_in]
    modules = {"stand-in (no math)": stand_in, "layer1 (the export's)": llm._modules["layer1"]}
    times = {name: [] for name in modules}
    for name, m in modules.items():  # warm-up: first calls resize MNN's graph
        timed_blocks(m, inputs, attn_in, attn, 2)
    for _ in range(args.calls // BLOCK):
        for name, m in modules.items():  # interleaved blocks
            times[name] += timed_blocks(m, inputs, attn_in, attn, 1)
    calls = c.n_layers + 2
    print(f"model {cfg['model']['name']}, {cfg['runtime']['threads']} threads, memory {cfg['runtime']['memory']}; "
          f"{calls} Module.forward calls per decode token ({c.n_layers} layers + tail + lm_head)")
    print(f"{'module':>24} {'us/call min':>12} {'median':>8} {'ms/token at min':>16}")
    for name, t in times.items():
        print(f"{name:>24} {min(t) * 1e6:>12.1f} {statistics.median(t) * 1e6:>8.1f} {min(t) * calls * 1e3:>16.2f}")
    print("us/call: one call as the engine makes it (forward, read q/k/v, write the attention input), "
          f"min and median over blocks of {BLOCK} calls; ms/token: the min times {calls} calls. The stand-in's "
          "figure is the fixed cost of a call: what fusing modules could save per call removed.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
