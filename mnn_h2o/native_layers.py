"""A decode token's layers in our core (native DecodeLayers), from the export's decode_layers.npz.

Why: one-row products are where MNN's int4 modules are slowest (AVX2 kernels, their threads
synchronised per op: ~200 us a layer at 512 tokens of context). DecodeLayers runs the same two
halves of decoder_layer.py on the GGUF's own 4-bit blocks, each product's activation rounded twice
to int8 per block of 32 (codes, then residual codes: native/include/mnn_h2o/dense/q4_matrix.h).
Prefill stays with MNN's modules.
"""
from __future__ import annotations

import numpy as np

from . import native
from .export import DECODE_MATRICES
from .gguf_model import ModelConfig

_FIELDS = ("nibbles", "scales", "mins")


def load_decode_layers(path: str, cfg: ModelConfig, threads: int):
    """The export's decode layers (decode_layers.npz) as a native DecodeLayers."""
    with np.load(path) as z:
        return decode_layers_from_arrays(z, cfg, threads)


def decode_layers_from_arrays(arrays, cfg: ModelConfig, threads: int):
    """A native DecodeLayers from export.decode_layer_arrays' arrays (a dict or an open npz),
    matched by name; a missing array is a KeyError naming it, a wrong shape a ValueError naming
    the layer and the matrix (DecodeLayers checks every one)."""
    names = set(arrays.files if hasattr(arrays, "files") else arrays)
    layers = []
    for i in range(cfg.n_layers):
        d = {}
        for name in DECODE_MATRICES:
            for f in _FIELDS:
                key = f"{i}.{name}.{f}"
                if key not in names:
                    raise KeyError(f"decode layers: no array {key!r}")
                a = np.asarray(arrays[key])
                d[f"{name}.{f}"] = a if f == "nibbles" else a.astype(np.float16).view(np.uint16)
        for key in ("attn_norm", "ffn_norm", "qkv_bias"):
            if f"{i}.{key}" in names:
                d[key] = np.asarray(arrays[f"{i}.{key}"], np.float32)
        layers.append(d)
    shape = {"hidden": cfg.hidden, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
             "head_dim": cfg.head_dim, "ffn": cfg.ffn, "rms_eps": cfg.rms_eps}
    return native.DecodeLayers(shape, layers, threads=threads)
