"""A plain numpy forward pass of a Llama-family model, written from the architecture.

No MNN, no native code: this is the yardstick the engine is checked against. It runs the whole
sequence at once (causal attention, full KV), in float64 by default.
"""
from __future__ import annotations

import numpy as np

from .architecture import ARCHITECTURES, is_local
from .decoder_layer import check_form, finish_layer, start_layer
from .gguf_model import GgufModel
from .numpy_ops import NumpyOps, rope_tables


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int = 0) -> np.ndarray:
    """Softmax attention of q [n, n_heads, hd] over k, v [n, n_kv_heads, hd]; rows [n, n_heads * hd].
    ``window`` > 0: each query sees the newest ``window`` keys up to itself only (a sliding-window
    layer's)."""
    n, n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    mask = np.triu(np.full((n, n), -np.inf, dtype=q.dtype), 1)
    if window:
        mask += np.tril(np.full((n, n), -np.inf, dtype=q.dtype), -window)
    out = np.empty(q.shape, q.dtype)
    for hq in range(n_heads):
        hk = hq // group
        s = (q[:, hq, :] @ k[:, hk, :].T) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        out[:, hq, :] = s @ v[:, hk, :]
    return out.reshape(n, -1)


class ReferenceModel:
    def __init__(self, gguf: GgufModel, dtype=np.float64):
        check_form(gguf.config)
        self.cfg = gguf.config
        self.dtype = dtype
        self.layers = [{k: v.astype(dtype) for k, v in w.items()} for _, w in gguf.layers()]
        self.embed = gguf.embedding().astype(np.float32)
        self.out_norm = gguf.output_norm().astype(dtype)
        self.lm_head = self.embed if self.cfg.tied_embeddings else gguf.lm_head().astype(np.float32)

    def forward(self, ids, return_kv: bool = False, all_logits: bool = False, last_rows: int = 0):
        """Logits of the last position (or of all positions, or with ``last_rows`` > 0 of the
        last ``last_rows`` positions as ``[last_rows, vocab]``) for token ids ``ids``.

        With ``return_kv`` also returns the per-layer K (after RoPE) and V as
        ``[n_kv_heads, n, head_dim]`` arrays, the layout of the native cache.
        """
        c, dt, form = self.cfg, self.dtype, ARCHITECTURES[self.cfg.arch]
        ids = np.asarray(ids, dtype=np.int64)
        x = self.embed[ids].astype(dt)
        if form.embedding_scale == "sqrt_hidden":
            x = x * np.sqrt(c.hidden)
        pos = np.arange(len(ids))
        local = rope_tables(c, pos, dt, form.local_rope_base) if form.global_every else (None, None)
        ops = NumpyOps(c, *rope_tables(c, pos, dt), *local)
        kv = []
        for i, w in enumerate(self.layers):
            q, k, v = start_layer(ops, c, w, x, i)
            if return_kv:
                kv.append((k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()))
            window = c.sliding_window if is_local(c, i) else 0
            x = finish_layer(ops, c, w, x, causal_attention(q, k, v, window))
        rows = len(ids) if all_logits else max(1, last_rows)
        x = ops.rms_norm(x[-rows:], self.out_norm)
        logits = (x.astype(np.float32) @ self.lm_head.T).astype(np.float64)
        logits = logits if all_logits or last_rows else logits[0]
        return (logits, kv) if return_kv else logits
