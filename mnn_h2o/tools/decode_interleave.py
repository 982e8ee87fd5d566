"""H2O against our own full cache, decode steps interleaved token by token.

Two engines in one process, one with eviction off and one with the config's H2O, are prefilled
with the same essay prompt; then their decode steps alternate (A B, B A, A B, ...) over the same
teacher-forced tokens, so slow drifts of a noisy machine hit both alike. Prints the ratio of
mean step times, and the ratio per block of 50 tokens to show its spread.

    python -m mnn_h2o.tools.decode_interleave [--context 4096] [--tokens 400] [--target-lossy-ratio 3.2]
"""
import argparse
import copy
import time

import numpy as np

from ..config import load
from ..engine import Llm
from ..essays import essay_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--tokens", type=int, default=400, help="decode steps per engine (default 400)")
    ap.add_argument("--target-lossy-ratio", type=float, default=None,
                    help="override h2o.target_lossy_ratio for the H2O engine")
    args = ap.parse_args()
    cfg = load(args.config)
    cfg_h2o = copy.deepcopy(cfg)
    if args.target_lossy_ratio is not None:
        cfg_h2o["h2o"]["target_lossy_ratio"] = args.target_lossy_ratio
    name = cfg["model"]["name"]
    full = Llm.load(name, cfg, progress=False)
    full.configure_h2o(None)
    h2o = Llm.load(name, cfg_h2o, progress=False)
    ids = essay_tokens(full.tokenizer, args.context + args.tokens)
    for engine in (full, h2o):
        engine.reset()
        engine.prefill(ids[:args.context])
    times = {id(full): [], id(h2o): []}
    for i, token in enumerate(ids[args.context:]):
        for engine in ((full, h2o) if i % 2 == 0 else (h2o, full)):
            t0 = time.perf_counter()
            engine.decode(int(token))
            times[id(engine)].append(time.perf_counter() - t0)
    tf, th = np.array(times[id(full)]), np.array(times[id(h2o)])
    blocks = [tf[i:i + 50].mean() / th[i:i + 50].mean() for i in range(0, len(tf), 50)]
    print(f"{name}, {args.context}-token prompt, {len(tf)} decode steps each, H2O lossy ratio {h2o.stats.lossy_ratio:.3f}")
    print(f"full cache ms/token: median {np.median(tf) * 1e3:.2f}, mean {tf.mean() * 1e3:.2f}")
    print(f"H2O        ms/token: median {np.median(th) * 1e3:.2f}, mean {th.mean() * 1e3:.2f}")
    print(f"H2O / full: {tf.mean() / th.mean():.3f} (ratio of means); per 50 tokens "
          f"{min(blocks):.3f}-{max(blocks):.3f}, median {np.median(blocks):.3f}")


if __name__ == "__main__":
    main()
