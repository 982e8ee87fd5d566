"""The decoder layer's ops on numpy arrays, and the RoPE tables: the runtime's float math where it
runs the layer in numpy (the native tail's norms and its Q4_1 mins, native_tail.py; the engine's
rotation tables) and the reference model's (reference.py), written once for both, so that the
runtime does not import its yardstick."""
from __future__ import annotations

import numpy as np

from .gguf_model import ModelConfig


def rope_tables(cfg: ModelConfig, positions: np.ndarray, dtype=np.float64, base: float = 0.0):
    """cos/sin tables [n, head_dim] for the rotate-half RoPE convention (``base``: another RoPE base
    than the model's, e.g. its sliding-window layers')."""
    hd = cfg.head_dim
    inv = 1.0 / ((base or cfg.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = positions.astype(np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


class NumpyOps:
    """decoder_layer's ops on numpy arrays: rows [n, width] in, [n, heads, head_dim] to the attention."""

    def __init__(self, cfg: ModelConfig, cos: np.ndarray, sin: np.ndarray, local_cos=None, local_sin=None):
        self.eps, self.head_dim, self.cos, self.sin = cfg.rms_eps, cfg.head_dim, cos, sin
        self.local_cos, self.local_sin = local_cos, local_sin  # the sliding-window layers' tables

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def linear(self, x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def heads(self, x, n_heads):
        return x.reshape(len(x), n_heads, self.head_dim)

    def norm_heads(self, x, w, n_heads):
        return self.rms_norm(self.heads(x, n_heads), w).reshape(len(x), -1)

    def rope(self, x, n_heads, local: bool = False):
        x = self.heads(x, n_heads)
        half = self.head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        cos, sin = (self.local_cos, self.local_sin) if local else (self.cos, self.sin)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    def silu(self, x):
        return x / (1.0 + np.exp(-x))

    def gelu(self, x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
