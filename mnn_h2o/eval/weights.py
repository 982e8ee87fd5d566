"""python -m mnn_h2o.eval weights: weight precision against the exact model, and its speed.

Each variant is an export of the same GGUF with the layers' weights at ``model.weight_bits`` and
the output projection (lm_head, SmolLM2's tied embedding) at ``model.head_bits``, written as
LAYERS/HEAD (``8`` = 8/8, ``4`` = 4/4, ``4/8`` = 4-bit layers with an 8-bit head).

Quality: teacher-forced next-token distributions over ``--tokens`` tokens of one segment per
domain of the chosen split, against the exact model (mnn_h2o.reference, float64 numpy, the
GGUF's own weights): mean KL(exact || variant) in nats, top-1 agreement, perplexity.
Speed: every variant loaded in one process, prefill a context of essay text then greedy-decode
``--decode`` tokens, variants interleaved (A B C, C B A, ...) for ``--repetitions`` rounds;
median tok/s with min-max, and each variant's median over the first variant's.

Writes --json and a Markdown table beside it. Choose on --split dev, report --split test.
Cost on 2 cores: a first export per variant (~1 min each, cached), ~30 s per domain for the
exact model at 1024 tokens, ~1 min per context and round.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

DEFAULT_VARIANTS = "8,4,4/8"


def parse_variants(spec: str, allowed: Sequence[int]) -> List[Tuple[int, int]]:
    """'8,4,4/8' -> [(8, 8), (4, 4), (4, 8)] (layers bits, head bits)."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            bits = tuple(int(x) for x in part.split("/"))
        except ValueError:
            raise ValueError(f"variant {part!r}: expected LAYERS or LAYERS/HEAD bits, e.g. 4/8") from None
        if len(bits) == 1:
            bits = (bits[0], bits[0])
        if len(bits) != 2 or any(b not in allowed for b in bits):
            raise ValueError(f"variant {part!r}: bits must be one of {tuple(allowed)}, as LAYERS or LAYERS/HEAD")
        if bits not in out:
            out.append(bits)
    if not out:
        raise ValueError("no variants given")
    return out


def name_of(bits: Tuple[int, int]) -> str:
    return str(bits[0]) if bits[0] == bits[1] else f"{bits[0]}/{bits[1]}"


def quality_vs_exact(exact_logits: np.ndarray, logits: np.ndarray, ids: Sequence[int]) -> Dict[str, float]:
    """Rows i of both predict ids[i + 1]; the last row has no target and is dropped."""
    from ..measure import log_softmax
    from .quality import metrics

    return metrics(log_softmax(exact_logits[:-1]), log_softmax(logits[:-1]), list(ids[1:]))


def table(result: dict) -> str:
    lines = ["| variant (layers/head bits) | domain | KL vs exact | top-1 vs exact | ppl | ppl exact |",
             "|---|---|---:|---:|---:|---:|"]
    for r in result["quality"]:
        lines.append(f"| {r['variant']} | {r['domain']} | {r['kl']:.4f} | {r['top1']:.3f} | "
                     f"{r['ppl']:.3f} | {r['ppl_full']:.3f} |")
    if result["speed"]:
        lines += ["", "| context | variant | decode tok/s (median, min-max) | vs first | prefill tok/s |",
                  "|---:|---|---:|---:|---:|"]
        for r in result["speed"]:
            d, p = r["decode_tps"], r["prefill_tps"]
            lines.append(f"| {r['context']} | {r['variant']} | {d['median']:.1f} ({d['min']:.1f}-{d['max']:.1f}) | "
                         f"{r['decode_vs_first']:.2f}x | {p['median']:.0f} |")
    return "\n".join(lines) + "\n"


def sweep(args, config_mod) -> int:
    from tqdm import tqdm

    from ..engine import Llm
    from ..essays import essay_tokens
    from ..export import WEIGHT_BITS, ensure_exported
    from ..gguf_model import GgufModel
    from ..measure import interleave, summarize, time_run
    from ..model_source import resolve_gguf
    from ..reference import ReferenceModel
    from . import domains as D

    variants = parse_variants(args.variants, WEIGHT_BITS)
    contexts = [] if args.no_speed else args.contexts
    doms = [d for d in args.domains.split(",") if d]
    base = config_mod.load(args.config, {"model.name": args.model} if args.model else {})
    llms = {}
    for bits in variants:
        # The export's precision lives in MNN's modules: the prompt runs there (the native layers
        # read the GGUF's own blocks whatever model.weight_bits says).
        cfg = config_mod.load(args.config, {"model.name": base["model"]["name"], "model.weight_bits": bits[0],
                                            "model.head_bits": bits[1], "runtime.prompt_layers": "mnn"})
        llms[name_of(bits)] = Llm(ensure_exported(cfg["model"]), cfg)
    tok = next(iter(llms.values())).tokenizer

    result = {"settings": {"variants": list(llms), "split": args.split, "domains": doms, "tokens": args.tokens,
                           "contexts": contexts, "decode": args.decode, "repetitions": args.repetitions,
                           "config": {s: base[s] for s in ("model", "runtime", "eviction")}},
              "quality": [], "speed": []}
    bar = tqdm(total=len(doms) * (1 + len(llms)) + len(contexts) * args.repetitions * len(llms),
               desc="weights", unit="run")
    if doms:
        exact = ReferenceModel(GgufModel(resolve_gguf(base["model"]["name"])), np.float64)
    for d in doms:
        seg = D.segments(tok, d, args.split, args.tokens, 0, 1)[0]
        ids = list(seg.prompt)
        ref = exact.forward(ids, all_logits=True)
        bar.update(1)
        for name, llm in llms.items():
            q = quality_vs_exact(ref, llm.logits(ids), ids)
            result["quality"].append(dict(q, variant=name, domain=d, offset=seg.offset, tokens=len(ids)))
            bar.update(1)
    for n in contexts:
        ids = essay_tokens(tok, n, offset=0)
        runs = interleave({name: (lambda llm=llm: time_run(llm, ids, args.decode)) for name, llm in llms.items()},
                          args.repetitions, on_run=lambda *_: bar.update(1))
        first = None
        for name, rs in runs.items():
            dec = summarize([r["decode_tps"] for r in rs])
            first = first or dec["median"]
            result["speed"].append({"context": n, "variant": name, "decode_tps": dec,
                                    "prefill_tps": summarize([r["prefill_tps"] for r in rs]),
                                    "decode_vs_first": dec["median"] / first})
    bar.close()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    md = os.path.splitext(args.json)[0] + ".md"
    with open(md, "w") as f:
        f.write(table(result))
    print(table(result))
    print(f"wrote {args.json} and {md}")
    return 0
