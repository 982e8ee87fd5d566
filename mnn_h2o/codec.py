"""Gear: lossless compression of KV-cache arrays (FP16, BF16, FP32, and the cache's q8 / q4 rows).

Frame format: ``docs/gear_format.md``. The array's last axis is channels, the one before it
tokens; leading axes (KV heads, ...) are independent slices. ::

    frame = encode(k_cache)          # bytes
    assert (decode(frame).view(np.uint16) == k_cache.view(np.uint16)).all()
    inspect(frame)["summary"]        # modes chosen, sizes

BF16 has no numpy dtype: pass the bit patterns as ``uint16`` with ``element_type="bf16"``;
:func:`decode` returns BF16 data as ``uint16``. Quantised rows (``element_type="q8"`` or ``"q4"``,
the KV cache's row formats: codes, then a binary16 scale per 32 values) are ``uint8`` arrays whose
last axis is the bytes of a row (34 per 32 values for q8, 18 for q4); the frame's shape, as
:func:`inspect` reports it, counts values instead. Round trips are bit-exact for every value
(NaN payloads, infinities, subnormals, -0). A damaged frame raises :class:`GearError`; it never
decodes to wrong data.
"""
from __future__ import annotations

import collections
import threading
from typing import Iterable, Optional

import numpy as np

from . import native

GearError = native.GearError

PREDICTORS = ("raw", "xor", "delta", "centre")
BACKENDS = ("stored", "rle", "zstd", "rans")
ELEMENT_TYPES = {"fp16": 1, "bf16": 2, "fp32": 3, "q8": 4, "q4": 5}
_NUMPY_DTYPE = {1: np.float16, 2: np.uint16, 3: np.float32, 4: np.uint8, 5: np.uint8}
QUANT_GROUP = 32
# Bytes of a quantised row per QUANT_GROUP values: the codes, then one binary16 scale.
_GROUP_BYTES = {4: QUANT_GROUP + 2, 5: QUANT_GROUP // 2 + 2}


def zstd_available() -> bool:
    """True when libzstd.so.1 could be loaded (otherwise the RLE and rANS backends remain)."""
    return native.gear_zstd_available()


def _frame_shape(shape, t: int) -> list:
    """The frame's dims of an array of element type t: a quantised row's bytes become its values."""
    if t not in _GROUP_BYTES:
        return list(shape)
    if len(shape) < 2 or shape[-1] % _GROUP_BYTES[t]:
        raise ValueError(f"quantised rows need an array [..., tokens, row bytes] with row bytes a multiple of "
                         f"{_GROUP_BYTES[t]}, got shape {tuple(shape)}")
    return list(shape[:-1]) + [shape[-1] // _GROUP_BYTES[t] * QUANT_GROUP]


def _array_shape(dims, t: int) -> tuple:
    """The decoded array's shape of a frame's dims (the inverse of _frame_shape)."""
    if t not in _GROUP_BYTES:
        return tuple(dims)
    return tuple(dims[:-1]) + (dims[-1] // QUANT_GROUP * _GROUP_BYTES[t],)


def _element_type(array: np.ndarray, element_type: Optional[str]) -> int:
    if element_type is not None:
        if element_type not in ELEMENT_TYPES:
            raise ValueError(f"element_type must be one of {sorted(ELEMENT_TYPES)}, not {element_type!r}")
        t = ELEMENT_TYPES[element_type]
        if t in _GROUP_BYTES:
            if array.dtype != np.uint8:
                raise ValueError(f"{element_type} rows are uint8 bytes, got {array.dtype}")
            return t
        if array.dtype.itemsize != (4 if t == 3 else 2):
            raise ValueError(f"{element_type} needs {4 if t == 3 else 2}-byte elements, got {array.dtype}")
        return t
    if array.dtype == np.float16:
        return 1
    if array.dtype == np.float32:
        return 3
    raise ValueError(f"cannot infer the element type of a {array.dtype} array: pass element_type=")


class Codec:
    """Encoder/decoder with fixed options, reusing its buffers and zstd contexts across calls.

    predictors: predictors the encoder may choose from per byte plane (``raw`` is always
        allowed): ``xor``/``delta`` along tokens, ``centre`` = per-channel exponent model.
    zstd_level: zstd compression level (1 is as good as higher levels on KV data, and fastest).
    block_tokens: tokens per block inside a frame; 0 (default) codes each slice (the tokens x
        channels matrix of one KV head) as one block, which compresses best. A cache that
        compresses block by block encodes each block as its own frame instead.
    dedup: code repeated token rows once (layer 0, where values depend on the token only).
    allow_rle, allow_zstd, allow_rans: backends the encoder may use (rANS: static order-0
        coding, with per-channel-group tables on long slices).

    Not thread-safe: use one per thread.
    """

    def __init__(self, predictors: Iterable[str] = PREDICTORS, zstd_level: int = 1,
                 block_tokens: int = 0, dedup: bool = True, allow_rle: bool = True,
                 allow_zstd: bool = True, allow_rans: bool = True):
        mask = 0
        for p in predictors:
            if p not in PREDICTORS:
                raise ValueError(f"unknown predictor {p!r}; choose from {PREDICTORS}")
            mask |= 1 << PREDICTORS.index(p)
        if block_tokens < 0:
            raise ValueError("block_tokens must be >= 0")
        self.options = dict(predictors=tuple(predictors), zstd_level=zstd_level,
                            block_tokens=block_tokens, dedup=dedup, allow_rle=allow_rle,
                            allow_zstd=allow_zstd, allow_rans=allow_rans)
        self._c = native.GearCodec(predictors=mask, allow_rle=allow_rle, allow_zstd=allow_zstd,
                                  allow_rans=allow_rans, zstd_level=zstd_level,
                                  block_tokens=block_tokens, dedup=dedup)

    def encode(self, array, element_type: Optional[str] = None) -> bytes:
        a = np.ascontiguousarray(array)
        if a.ndim < 1 or a.ndim > 8:
            raise ValueError("Gear arrays have 1 to 8 dimensions")
        t = _element_type(a, element_type)
        return self._c.encode(a.view(np.uint8).reshape(-1), t, _frame_shape(a.shape, t))

    def decode(self, data) -> np.ndarray:
        # inspect() walks the whole structure first, so a damaged frame is refused before any
        # output is allocated from the sizes it claims.
        info = self._c.inspect(data)
        t = info["element_type"]
        out = np.empty(_array_shape(info["shape"], t), dtype=_NUMPY_DTYPE[t])
        self._c.decode_into(data, out.reshape(-1).view(np.uint8))
        return out

    def decode_into(self, data, out: np.ndarray) -> None:
        """Decode into a preallocated C-contiguous array of the frame's size (no allocation)."""
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        self._c.decode_into(data, out.reshape(-1).view(np.uint8))

    def inspect(self, data) -> dict:
        return _describe(self._c.inspect(data), len(data))


def _describe(raw: dict, frame_size: int) -> dict:
    names = {v: k for k, v in ELEMENT_TYPES.items()}
    # A slice that shares the previous slice's map is listed with an empty map stream.
    streams = [dict(s, predictor=PREDICTORS[s["predictor"]], backend=BACKENDS[s["backend"]],
                    kind=(("map" if s["raw_len"] else "shared_map") if s["block"] < 0
                          else f"plane{s['plane']}"))
               for s in raw["streams"]]
    modes = collections.Counter((s["kind"], s["predictor"], s["backend"]) for s in streams)
    return {
        "element_type": names[raw["element_type"]],
        "shape": tuple(raw["shape"]),
        "block_tokens": raw["block_tokens"],
        "data_checksum": raw["data_checksum"],
        "frame_size": frame_size,
        "decoded_size": raw["decoded_size"],
        "ratio": raw["decoded_size"] / frame_size if frame_size else float("nan"),
        "streams": streams,
        "summary": {
            "header_bytes": raw["header_size"],
            "dedup_slices": sum(s["kind"] in ("map", "shared_map") for s in streams),
            "shared_maps": sum(s["kind"] == "shared_map" for s in streams),
            "modes": {f"{k}:{p}+{b}": n for (k, p, b), n in sorted(modes.items())},
            "payload_bytes": {k: sum(s["payload_len"] for s in streams if s["kind"] == k)
                              for k in sorted({s["kind"] for s in streams})},
        },
    }


_local = threading.local()


def _codec(**options) -> Codec:
    cache = getattr(_local, "codecs", None)
    if cache is None:
        cache = _local.codecs = {}
    key = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in options.items()))
    if key not in cache:
        cache[key] = Codec(**options)
    return cache[key]


def encode(array, *, element_type: Optional[str] = None, predictors: Iterable[str] = PREDICTORS,
           zstd_level: int = 1, block_tokens: int = 0, dedup: bool = True,
           allow_rle: bool = True, allow_zstd: bool = True, allow_rans: bool = True) -> bytes:
    """Compress ``array`` (float16, float32, uint16 with ``element_type="bf16"``, or uint8 rows with
    ``element_type="q8"`` / ``"q4"``) to a frame.

    Options as for :class:`Codec`.
    """
    return _codec(predictors=tuple(predictors), zstd_level=zstd_level, block_tokens=block_tokens,
                  dedup=dedup, allow_rle=allow_rle, allow_zstd=allow_zstd,
                  allow_rans=allow_rans).encode(array, element_type)


def decode(data) -> np.ndarray:
    """The array of a frame (bit-exact); raises :class:`GearError` on any damage."""
    return _codec().decode(data)


def inspect(data) -> dict:
    """Header, every stream's predictor/backend/sizes, and a summary of the modes chosen."""
    return _codec().inspect(data)
