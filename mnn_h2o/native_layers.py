"""The layers in our core (native DecodeLayers), from the export's decode_layers.npz: a decode
token's (``forward``) and a prompt chunk's (``forward_rows``, runtime.prompt_layers native).

Why: one-row products are where MNN's int4 modules are slowest (AVX2 kernels, their threads
synchronised per op: ~200 us a layer at 512 tokens of context). DecodeLayers runs the same two
halves of decoder_layer.py on the GGUF's own blocks (Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K, mixed per matrix
as Q4_K_M files are: native/include/mnn_h2o/dense/weight_matrix.h), each product's activation
rounded twice to int8 per block of 32 (codes, then residual codes: dense/q4_matrix.h); a prompt
chunk's products batched over its rows (dense/batched_product.h).
"""
from __future__ import annotations

import numpy as np

from . import native
from .architecture import layer_options
from .export import DECODE_MATRICES
from .gguf_model import LAYER_VECTORS, ModelConfig
from .stored_arrays import stored_members

def load_decode_layers(path: str, cfg: ModelConfig, threads: int, q8_head=None):
    """The export's decode layers (decode_layers.npz) as a native DecodeLayers; ``q8_head`` as
    decode_layers_from_arrays'. Each matrix's blocks are read from the file straight into the
    core's memory (StoredBlocks): the 1.5B's 191 MB output matrix was held twice for a moment
    when read as an array first (the load's peak 1.33 GB against 1.13 after it)."""
    stored = stored_members(path)
    with np.load(path) as z:
        return decode_layers_from_arrays(z, cfg, threads, q8_head, blocks=stored.get)


def holds_head_matrix(path: str) -> bool:
    """Whether the export's decode layers hold the output matrix's blocks (not a Q8_0 one's)."""
    with np.load(path) as z:
        return "head.types" in z.files


def decode_layers_from_arrays(arrays, cfg: ModelConfig, threads: int, q8_head=None, blocks=None):
    """A native DecodeLayers from export.decode_layer_arrays' arrays (a dict or an open npz),
    matched by name; a missing array is a KeyError naming it, a wrong shape or type a ValueError
    naming the layer and the matrix (DecodeLayers checks every one). ``q8_head``: a native
    Q8Matrix (the export's q8 rows of a Q8_0 output matrix) the layers hold as their output
    matrix, shared, where the arrays hold none; with arrays that hold one it is an error.
    ``blocks(name)``: a matrix part's StoredBlocks, or None to read it as an array."""
    names = set(arrays.files if hasattr(arrays, "files") else arrays)

    def get(key):
        if key not in names:
            raise KeyError(f"decode layers: no array {key!r}")
        return np.asarray(arrays[key])

    def part(key):
        return (blocks and blocks(key)) or get(key)

    def layer(i):
        d = {}
        for name in DECODE_MATRICES:
            types = [str(t) for t in get(f"{i}.{name}.types")]
            d[name] = [(t, part(f"{i}.{name}.{j}")) for j, t in enumerate(types)]
        for key in (*LAYER_VECTORS, "qkv_bias"):
            if f"{i}.{key}" in names:
                d[key] = np.asarray(arrays[f"{i}.{key}"], np.float32)
        return d

    class Layers:  # read from the npz as the core copies each (a layer's blocks held twice, not the model's)
        def __len__(self):
            return cfg.n_layers

        def __getitem__(self, i):
            if not 0 <= i < cfg.n_layers:
                raise IndexError(i)
            return layer(i)

    shape = {"hidden": cfg.hidden, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
             "head_dim": cfg.head_dim, "ffn": cfg.ffn, "rms_eps": cfg.rms_eps,
             "form": layer_options(cfg)}
    head = None
    if "head.types" in names:
        if q8_head is not None:
            raise ValueError("decode layers: the file holds the output matrix, and q8 rows were given for it too")
        head = {"out_norm": np.asarray(get("out_norm"), np.float32),
                "matrix": [(str(t), part(f"head.{j}")) for j, t in enumerate(get("head.types"))]}
    elif q8_head is not None:
        head = {"out_norm": np.asarray(get("out_norm"), np.float32), "q8_rows": q8_head}
    out = native.DecodeLayers(shape, Layers(), threads=threads, head=head)
    release_freed_memory()
    return out


def release_freed_memory() -> None:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim): the arrays read
    from the npz were freed after the core copied them, but glibc keeps freed blocks below its
    mmap threshold in the heap, and a process then holds the model's size twice in RSS (measured on
    Qwen2.5-1.5B: 1.9 GB after loading, 1.1 GB after the trim). Elsewhere it does nothing."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)
