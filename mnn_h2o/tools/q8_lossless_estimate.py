"""What a lossless stage could gain on q8 KV rows (issue 18 item 3), before anyone builds one.

    python -m mnn_h2o.tools.q8_lossless_estimate [--tokens 2048] [--chunk-tokens 128]

The lossless store takes float rows only (Gear's byte planes split sign/exponent from mantissa,
which int8 codes do not have), so a q8 cache with `lossless.mode` other than off is refused.
This tool measures whether that refusal leaves much on the table: it takes SmolLM2's real K
(after RoPE) and V on essay text (the numpy reference, as `kv_codec_eval`), quantises every row
with the cache's own q8 encoder (docs/kv_cache.md: int8 codes + a binary16 scale per 32
values) and reports, for K and V over all layers and heads, raw q8 bytes / coded bytes for:

- zstd-3 on each chunk of `--chunk-tokens` tokens of one head, codes channel-major (the layout
  that groups a channel's similar values), scales appended raw;
- the order-0 entropy of each chunk's codes (a per-chunk adaptive coder with free tables);
- a per-channel order-0 entropy of each chunk (one distribution per channel and chunk, free
  tables: optimistic, since 128 samples cannot pay for 64 tables);
- a per-channel order-0 entropy over all tokens of a head (a static per-channel model, the
  ceiling of anything that does not model context).

The scales (1/17 of a q8 row) are counted raw in every figure. Bounds with free tables are upper
limits, not what a coder reaches.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

import numpy as np

from .kv_codec_eval import collect_kv, default_model_path, order0_bits, zstd_size

def quantise_q8(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """int8 codes [..., D] and binary16 scales [..., D/32] of rows ``x`` [..., D], from the
    cache's own encoder (``_core.kv_rows_encode``), split as docs/kv_cache.md's q8 row: D codes,
    then the scales."""
    from .. import _core
    dim = x.shape[-1]
    rows = _core.kv_rows_encode("q8", np.ascontiguousarray(x, dtype=np.float32).reshape(-1, dim))
    codes = rows[:, :dim].view(np.int8).reshape(x.shape)
    scales = np.ascontiguousarray(rows[:, dim:]).view("<f2").reshape(x.shape[:-1] + (dim // 32,))
    return codes, scales


def entropy_bytes(codes: np.ndarray) -> float:
    """Order-0 size in bytes of int8 ``codes`` under their own histogram (kv_codec_eval's measure,
    on the codes' bytes)."""
    return order0_bits(codes.view(np.uint8)) * codes.size / 8


ESTIMATES = ("zstd3_chunks", "order0_chunks", "order0_per_channel_chunks", "order0_per_channel_static")


def coded_bytes(arrays: List[np.ndarray], chunk_tokens: int) -> Dict[str, float]:
    """Raw q8 bytes and the bytes of each estimate over ``arrays`` [heads, T, D]; the scales are
    raw in all of them."""
    codes_only = dict.fromkeys(ESTIMATES, 0.0)
    raw_codes = scale_bytes = 0
    for a in arrays:
        codes, scales = quantise_q8(a)
        heads, tokens, dim = codes.shape
        raw_codes += codes.size
        scale_bytes += scales.size * 2
        for h in range(heads):
            for t0 in range(0, tokens, chunk_tokens):
                c = codes[h, t0:t0 + chunk_tokens]
                codes_only["zstd3_chunks"] += zstd_size(np.ascontiguousarray(c.T).tobytes(), 3)
                codes_only["order0_chunks"] += entropy_bytes(c)
                codes_only["order0_per_channel_chunks"] += sum(entropy_bytes(c[:, d]) for d in range(dim))
            codes_only["order0_per_channel_static"] += sum(entropy_bytes(codes[h, :, d]) for d in range(dim))
    return {"raw": raw_codes + scale_bytes, **{k: v + scale_bytes for k, v in codes_only.items()}}


def ratios(*parts: Dict[str, float]) -> Dict[str, float]:
    """Summed raw bytes / summed coded bytes (never a mean of ratios)."""
    raw = sum(p["raw"] for p in parts)
    return {k: raw / sum(p[k] for p in parts) for k in ESTIMATES}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.q8_lossless_estimate",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048, help="essay tokens run through the model (default 2048)")
    p.add_argument("--chunk-tokens", type=int, default=128,
                   help="tokens per chunk, as lossless.chunk_tokens (default 128)")
    p.add_argument("--model", default=None, help="GGUF model file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--json", metavar="FILE", help="also write the numbers here")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.chunk_tokens < 1:
        p.error("--tokens and --chunk-tokens must be positive")

    kv = collect_kv(args.model or default_model_path(), args.tokens)
    k_bytes = coded_bytes([k for k, _ in kv], args.chunk_tokens)
    v_bytes = coded_bytes([v for _, v in kv], args.chunk_tokens)
    result = {"tokens": args.tokens, "chunk_tokens": args.chunk_tokens,
              "K": ratios(k_bytes), "V": ratios(v_bytes), "KV": ratios(k_bytes, v_bytes)}
    print(f"q8 rows of SmolLM2 on {args.tokens} essay tokens, {args.chunk_tokens}-token chunks; "
          "raw q8 bytes / coded bytes (scales raw):")
    print("| | " + " | ".join(ESTIMATES) + " |")
    print("|---|" + "---:|" * len(ESTIMATES))
    for part in ("K", "V", "KV"):
        print(f"| {part} | " + " | ".join(f"{result[part][k]:.3f}" for k in ESTIMATES) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
