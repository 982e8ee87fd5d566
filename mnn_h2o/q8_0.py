"""llama.cpp's q8_0 block format: the rows of the native lm_head (export.py), and a fake
quantiser for the kvpress peer's float KV cache (eval/kvpress_peer.py).

A q8_0 block is 32 consecutive values (along a weight row, or a KV row's head_dim) stored as one
fp16 scale and 32 int8 codes, 34 bytes against f16's 64. We follow ggml's reference quantiser
(``quantize_row_q8_0_ref``, the definition the format's tests check against):

- ``d = max|x| / 127`` in float32; the block stores ``fp16(d)`` (round to nearest even);
- codes ``= roundf(x * (1 / d))`` with the float32 ``d`` (before its fp16 rounding), ties
  rounded away from zero; an all-zero block has ``d = 0`` and codes 0. We clamp the codes to
  [-127, 127], which the reference never exceeds but states nowhere;
- dequantised, as ggml's ``dequantize_row_q8_0`` does: ``code * float(fp16(d))``.

(ggml's x86 SIMD quantiser multiplies by ``127 / max|x|`` and rounds ties to even; the two
differ only where ``x * 127 / max|x|`` falls exactly on a half, which real activations all but
never do.) Values are dequantised into the caller's dtype, the model's compute dtype.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

BLOCK = 32                       # values per block
BLOCK_BYTES = BLOCK + 2          # int8 codes + fp16 scale
F16_BLOCK_BYTES = 2 * BLOCK


def gain() -> float:
    """f16 bytes / q8_0 bytes of the same values (64/34): what the element type alone saves."""
    return F16_BLOCK_BYTES / BLOCK_BYTES


def row_bytes(values: int) -> int:
    """q8_0 bytes of a row of ``values`` (a multiple of 32)."""
    _check(values)
    return values // BLOCK * BLOCK_BYTES


def _check(values: int) -> None:
    if values % BLOCK:
        raise ValueError(f"q8_0 needs rows of a multiple of {BLOCK} values, got {values}")


def quantize(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Codes (int8, the shape of ``x``) and scales (float16, ``[..., last / 32]``) of ``x``,
    blocks of 32 along the last axis."""
    x = np.asarray(x, np.float32)
    _check(x.shape[-1])
    b = x.reshape(x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK))
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    scaled = (b * inv).astype(np.float64)  # float32 products, widened: + 0.5 below is then exact
    codes = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # roundf: ties away from zero
    codes = np.clip(codes, -127, 127).astype(np.int8).reshape(x.shape)
    return codes, d[..., 0].astype(np.float16)


def dequantize(codes: np.ndarray, scales: np.ndarray, dtype=np.float32) -> np.ndarray:
    b = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // BLOCK, BLOCK)).astype(np.float32)
    return (b * scales.astype(np.float32)[..., None]).reshape(codes.shape).astype(dtype)


def fake(x: np.ndarray) -> np.ndarray:
    """``x`` stored as q8_0 and read back, in ``x``'s dtype."""
    x = np.asarray(x)
    return dequantize(*quantize(x), dtype=x.dtype)


def fake_torch(t):
    """:func:`fake` of a torch tensor (any layout; head_dim last), as a tensor of its dtype."""
    import torch

    return torch.from_numpy(fake(t.detach().to(torch.float32).cpu().numpy())).to(t.dtype)
