"""A GGUF requantised by llama.cpp's own quantizer (another k-quant mix of the same model), decoded in
our core against the exact model: the mean KL of 64 teacher-forced decode tokens after a 192-token
essay prompt (f16 KV, no eviction), as tests/test_qwen25_1p5b.py measures the named file. For the
weight types no model here is stored in (Q5_K: a Q5_K_M file).

    python -m mnn_h2o.tools.requantized_kl [--model qwen2.5-1.5b] [--ftype Q5_K_M] [--out FILE]

Needs the `llama` extra (llama-cpp-python) for the quantizer; the file is made once (``--out``).
"""
import argparse
import collections
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-1.5b", help="named model or GGUF path to requantise")
    ap.add_argument("--ftype", default="Q5_K_M", help="llama.cpp's file type (LLAMA_FTYPE_MOSTLY_<FTYPE>)")
    ap.add_argument("--out", help="the requantised file (default: beside the source, its ftype in the name)")
    args = ap.parse_args()

    import gguf
    import llama_cpp

    from ..engine import Llm
    from .. import config
    from ..essays import essay_tokens
    from ..gguf_model import GgufModel
    from ..measure import log_softmax
    from ..model_source import resolve_gguf
    from ..reference import ReferenceModel

    src = resolve_gguf(args.model)
    out = args.out or os.path.splitext(src)[0] + f"-requant-{args.ftype.lower()}.gguf"
    if not os.path.exists(out):
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.ftype}")
        p.allow_requantize = True
        p.nthread = 2
        t = time.perf_counter()
        if llama_cpp.llama_model_quantize(src.encode(), (out + ".tmp").encode(), p) != 0:
            raise SystemExit(f"llama.cpp could not quantise {src} to {args.ftype}")
        os.replace(out + ".tmp", out)
        print(f"quantised to {out} in {time.perf_counter() - t:.0f} s")
    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(out).tensors)
    print(f"{out}: tensors {dict(types)}")
    cfg = config.validate({"model": {"name": out}, "runtime": {"kv_dtype": "f16"}, "eviction": {"enabled": False}})
    llm = Llm.load(out, cfg)
    ids = essay_tokens(llm.tokenizer, 256)
    prompt, cont = ids[:192], ids[192:]
    rows = [llm.prefill(prompt)]
    calls = llm.stats.mnn_calls
    rows += [llm.decode(t) for t in cont[:-1]]
    calls = llm.stats.mnn_calls - calls
    got = log_softmax(np.stack(rows).reshape(len(cont), -1))
    del llm
    exact = log_softmax(ReferenceModel(GgufModel(out), np.float32).forward(ids, all_logits=True)[191:-1]
                        .astype(np.float64))
    kl = np.sum(np.exp(exact) * (exact - got), axis=-1)
    print(f"{args.ftype}: KL to the exact model over {len(cont)} decode tokens: mean {kl.mean():.5f}, max "
          f"{kl.max():.4f}; top-1 agreement {np.mean(got.argmax(-1) == exact.argmax(-1)):.3f}; MNN calls in "
          f"decode: {calls}")


if __name__ == "__main__":
    main()
