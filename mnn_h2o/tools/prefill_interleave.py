"""Prefill time of several cache configurations against each other, prompts interleaved.

Each engine (the same DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY] spelling as
decode_interleave's) prefills the same essay prompt from an empty cache, round after round, the
order rotating each round (A B, B A, ...) so slow drifts of a noisy machine hit all alike. Prints
per engine the median prefill time with its range, the part of it spent in kvzip's
reconstruction pass, and the ratio of each engine's median to the first engine's.

    python -m mnn_h2o.tools.prefill_interleave [--contexts 4096 7936] [--rounds 2]
        [--engines q8:h2o q8:kvzip]
"""
import argparse
import copy

import numpy as np

from ..config import load
from ..engine import Llm
from ..essays import essay_tokens
from ..export import ensure_exported
from .decode_interleave import parse_engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096], help="prompt tokens (default 4096)")
    ap.add_argument("--rounds", type=int, default=2, help="prefills per engine and context (default 2)")
    ap.add_argument("--engines", nargs="+", default=["q8:h2o", "q8:kvzip"],
                    help="DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL]] per engine (as "
                         "decode_interleave's); ratios are against the first (default q8:h2o q8:kvzip)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    cfg = load(args.config)
    cfg["lossless"]["mode"] = "off"
    engines = []
    for label, h2o, dtype, (weight_bits, head_bits), memory, (lm_head, tail, decode_layers) in (parse_engine(s, cfg)
                                                                               for s in args.engines):
        c = copy.deepcopy(cfg)
        c["runtime"].update(kv_dtype=dtype, memory=memory, lm_head=lm_head, tail=tail, decode_layers=decode_layers,
                            prompt_layers=decode_layers)
        c["model"].update(weight_bits=weight_bits, head_bits=head_bits)
        llm = Llm(ensure_exported(c["model"], progress=False), c)
        if max(args.contexts) > llm.max_context:
            raise SystemExit(f"--contexts: {max(args.contexts)} tokens is past the context limit {llm.max_context} "
                             "(runtime.max_context / the model's)")
        llm.configure_h2o(h2o)
        engines.append((label, llm))
    n = len(engines)
    print(f"{cfg['model']['name']}, essay prompts, {args.rounds} rounds, {cfg['runtime']['threads']} threads, "
          f"order rotating each round")
    print(f"{'context':>7} {'engine':>16} {'prefill s':>9} {'range':>13} {'pass s':>7} {'vs first':>8}")
    for context in args.contexts:
        ids = essay_tokens(engines[0][1].tokenizer, context)
        total = [[] for _ in engines]
        passed = [[] for _ in engines]
        for r in range(args.rounds):
            for j in range(n):
                e = (r + j) % n
                llm = engines[e][1]
                llm.reset()
                s0, p0 = llm.stats.prefill_s, llm.stats.reconstruct_s
                llm.prefill(ids)
                total[e].append(llm.stats.prefill_s - s0)
                passed[e].append(llm.stats.reconstruct_s - p0)
        first = np.median(total[0])
        for (label, _), t, p in zip(engines, total, passed):
            print(f"{context:>7} {label:>16} {np.median(t):>9.2f} {min(t):>6.2f}-{max(t):<6.2f} "
                  f"{np.median(p):>7.2f} {np.median(t) / first:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
