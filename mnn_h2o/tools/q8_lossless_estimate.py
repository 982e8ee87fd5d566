"""What the lossless stage gains on q8 KV rows, against what coders of the codes could gain.

    python -m mnn_h2o.tools.q8_lossless_estimate [--tokens 2048] [--chunk-tokens 128] [--dtype q8r]

The lossless store codes a q8 cache's chunks as Gear Q8 frames (docs/gear_format.md
"Quantised rows": the codes, the scales' low bytes and their high bytes as three planes). This
tool takes SmolLM2's real K (after RoPE) and V on essay text (the numpy reference, as
`kv_codec_eval`), quantises every row with the cache's own encoder of `--dtype` (docs/kv_cache.md:
int8 codes + a binary16 scale per 32 values; q8r rotates each row first, the default's rows) and
reports, for K and V over all layers and heads, raw
q8 bytes / coded bytes for:

- Gear on each chunk of `--chunk-tokens` tokens of one head, as the store codes it: whole Q8
  frames (headers, codes and scales coded; the store puts K and V of a chunk in one frame, here
  they are one frame each);
- zstd-3 on each chunk of `--chunk-tokens` tokens of one head, codes channel-major (the layout
  that groups a channel's similar values), scales appended raw;
- the order-0 entropy of each chunk's codes (a per-chunk adaptive coder with free tables);
- a per-channel order-0 entropy of each chunk (one distribution per channel and chunk, free
  tables: optimistic, since 128 samples cannot pay for 64 tables);
- a per-channel order-0 entropy over all tokens of a head (a static per-channel model, the
  ceiling of anything that does not model context).

The scales (1/17 of a q8 row) are counted raw in every figure but Gear's. Bounds with free tables
are upper limits, not what a coder reaches.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

import numpy as np

from .. import codec
from ..config import INT8_KV, defaults
from .kv_codec_eval import collect_kv, default_model_path, order0_bits, zstd_size


def q8_rows(x: np.ndarray, dtype: str = "q8") -> np.ndarray:
    """The int8 rows [..., D + D/16] (uint8) of rows ``x`` [..., D] as a cache of ``dtype`` (q8 or
    q8r) stores them (``native.kv_rows_encode``)."""
    from .. import native
    dim = x.shape[-1]
    rows = native.kv_rows_encode(dtype, np.ascontiguousarray(x, dtype=np.float32).reshape(-1, dim))
    return rows.reshape(x.shape[:-1] + (rows.shape[-1],))


def split_q8(rows: np.ndarray, dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """int8 codes [..., D] and binary16 scales [..., D/32] of q8 rows, as docs/kv_cache.md's q8
    row lays them out: D codes, then the scales."""
    return rows[..., :dim].view(np.int8), np.ascontiguousarray(rows[..., dim:]).view("<f2")


def quantise_q8(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The codes and scales of rows ``x`` [..., D] quantised by the cache's encoder."""
    return split_q8(q8_rows(x), x.shape[-1])


def _default_int8() -> str:
    dtype = defaults()["runtime"]["kv_dtype"]
    return dtype if dtype in INT8_KV else "q8"


def entropy_bytes(codes: np.ndarray) -> float:
    """Order-0 size in bytes of int8 ``codes`` under their own histogram (kv_codec_eval's measure,
    on the codes' bytes)."""
    return order0_bits(codes.view(np.uint8)) * codes.size / 8


ESTIMATES = ("gear_chunks", "zstd3_chunks", "order0_chunks", "order0_per_channel_chunks", "order0_per_channel_static")


def coded_bytes(arrays: List[np.ndarray], chunk_tokens: int, dtype: str = "q8") -> Dict[str, float]:
    """Raw int8-row bytes and the bytes of each estimate over ``arrays`` [heads, T, D]; the scales
    are raw in all of them but gear_chunks (whole frames)."""
    codes_only = {k: 0.0 for k in ESTIMATES if k != "gear_chunks"}
    raw_codes = scale_bytes = gear = 0
    for a in arrays:
        rows = q8_rows(a, dtype)
        codes, scales = split_q8(rows, a.shape[-1])
        heads, tokens, dim = codes.shape
        raw_codes += codes.size
        scale_bytes += scales.size * 2
        for h in range(heads):
            for t0 in range(0, tokens, chunk_tokens):
                gear += len(codec.encode(rows[h, t0:t0 + chunk_tokens], element_type="q8"))
                c = codes[h, t0:t0 + chunk_tokens]
                codes_only["zstd3_chunks"] += zstd_size(np.ascontiguousarray(c.T).tobytes(), 3)
                codes_only["order0_chunks"] += entropy_bytes(c)
                codes_only["order0_per_channel_chunks"] += sum(entropy_bytes(c[:, d]) for d in range(dim))
            codes_only["order0_per_channel_static"] += sum(entropy_bytes(codes[h, :, d]) for d in range(dim))
    return {"raw": raw_codes + scale_bytes, **{k: v + scale_bytes for k, v in codes_only.items()}, "gear_chunks": gear}


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
    p.add_argument("--dtype", choices=INT8_KV, default=_default_int8(),
                   help="the cache's int8 rows (default: the config's runtime.kv_dtype where it is one of these)")
    p.add_argument("--json", metavar="FILE", help="also write the numbers here")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.chunk_tokens < 1:
        p.error("--tokens and --chunk-tokens must be positive")

    kv = collect_kv(args.model or default_model_path(), args.tokens)
    k_bytes = coded_bytes([k for k, _ in kv], args.chunk_tokens, args.dtype)
    v_bytes = coded_bytes([v for _, v in kv], args.chunk_tokens, args.dtype)
    result = {"tokens": args.tokens, "chunk_tokens": args.chunk_tokens, "dtype": args.dtype,
              "K": ratios(k_bytes), "V": ratios(v_bytes), "KV": ratios(k_bytes, v_bytes)}
    print(f"{args.dtype} rows of SmolLM2 on {args.tokens} essay tokens, {args.chunk_tokens}-token chunks; "
          f"raw {args.dtype} bytes / coded bytes (scales raw but in gear_chunks):")
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
