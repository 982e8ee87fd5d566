"""The tail (the last layer's end and the final norm) in our core: the GGUF's weights, float activations.

Why: under MNN's memory low every module rounds its activation to int8, and at the model's end
that rounding reaches the logits almost directly. With the native lm_head the tail's rounding was
the largest single share left of the int8 engine's floor (docs/notebook/int8_floor_modules.md);
here the same finish_layer runs in float32 over the GGUF's own blocks of 32 (export.tail_arrays,
``tail_blocks.npz``): value = code * scale + min per block, so

    x . row = sum over blocks b of  scale_b * (x_b . codes_b)  +  min_b * sum(x_b)

The first term is Q8Matrix's (the lm_head's kernel: int8 codes, one fp16 scale per 32); the
second, for Q4_1's mins, is a [blocks] x [blocks, rows] product of the block sums of x.
"""
from __future__ import annotations

import numpy as np

from . import native
from .decoder_layer import finish_layer
from .export import TAIL_MATRICES, TAIL_VECTORS
from .gguf_model import ModelConfig
from .numpy_ops import NumpyOps


class _BlockMatrix:
    """One matrix as blocks of 32: codes * scale through Q8Matrix, plus the mins' term."""

    def __init__(self, codes: np.ndarray, scales: np.ndarray, mins: np.ndarray, threads: int):
        self.q8 = native.Q8Matrix(codes, scales.view(np.uint16), threads=threads)
        self.rows, self.cols = self.q8.rows, self.q8.cols
        if mins.shape != scales.shape:
            raise ValueError(f"mins of shape {mins.shape} for scales of shape {scales.shape}")
        self.mins_t = np.ascontiguousarray(mins.astype(np.float32).T) if np.any(mins) else None

    def multiply(self, x: np.ndarray) -> np.ndarray:
        y = self.q8.multiply(x)
        if self.mins_t is not None:
            y += x.reshape(len(x), -1, 32).sum(axis=-1) @ self.mins_t
        return y


class _BlockOps(NumpyOps):
    """decoder_layer's ops in float32 rows, the matrices being _BlockMatrix objects."""

    def linear(self, x, w, b=None):
        y = w.multiply(np.ascontiguousarray(x, np.float32))
        return y if b is None else y + b


class NativeTail:
    """``tail(h, attn)``: the final-normed hidden state ([n, hidden] float32) from the residual
    stream ``h`` and the last layer's attention output ``attn``, as MNN's ``tail`` module computes it."""

    def __init__(self, path: str, cfg: ModelConfig, threads: int):
        shapes = {"wo": (cfg.hidden, cfg.n_heads * cfg.head_dim), "w_gate": (cfg.ffn, cfg.hidden),
                  "w_up": (cfg.ffn, cfg.hidden), "w_down": (cfg.hidden, cfg.ffn)}
        with np.load(path) as z:
            self._w = {name: _BlockMatrix(z[name + ".codes"], z[name + ".scales"], z[name + ".mins"], threads)
                       for name in TAIL_MATRICES}
            self._w.update((name, z[name]) for name in TAIL_VECTORS if name in z.files)
            self._out_norm = z["out_norm"]
        for name, shape in shapes.items():
            m = self._w[name]
            if (m.rows, m.cols) != shape:
                raise ValueError(f"{path}: {name} is [{m.rows}, {m.cols}], the model needs {list(shape)}")
        self._ops = _BlockOps(cfg, None, None)
        self._cfg = cfg

    def __call__(self, h: np.ndarray, attn: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # SiLU's exp(-x) of a very negative x: inf, and x / inf = 0
            # (GELU's tanh of a large x is 1, its cube may overflow: the same)
            return self._ops.rms_norm(finish_layer(self._ops, self._cfg, self._w, h, attn), self._out_norm)
