"""A plain numpy forward pass of a Llama-family model, written from the architecture.

No MNN, no native code: this is the yardstick the engine is checked against. It runs the whole
sequence at once (causal attention, full KV), in float64 by default.
"""
from __future__ import annotations

import numpy as np

from .gguf_model import GgufModel, ModelConfig


def rope_tables(cfg: ModelConfig, positions: np.ndarray, dtype=np.float64):
    """cos/sin tables [n, head_dim] for the rotate-half RoPE convention."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = positions.astype(np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: [n, heads, hd]; rotate-half RoPE."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


class ReferenceModel:
    def __init__(self, gguf: GgufModel, dtype=np.float64):
        self.cfg = gguf.config
        self.dtype = dtype
        self.layers = [{k: v.astype(dtype) for k, v in w.items()} for _, w in gguf.layers()]
        self.embed = gguf.embedding().astype(np.float32)
        self.out_norm = gguf.output_norm().astype(dtype)
        self.lm_head = self.embed if self.cfg.tied_embeddings else gguf.lm_head().astype(np.float32)

    def forward(self, ids, return_kv: bool = False, all_logits: bool = False):
        """Logits of the last position (or of all positions) for token ids ``ids``.

        With ``return_kv`` also returns the per-layer K (after RoPE) and V as
        ``[n_kv_heads, n, head_dim]`` arrays, the layout of the native cache.
        """
        c, dt = self.cfg, self.dtype
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        x = self.embed[ids].astype(dt)
        cos, sin = rope_tables(c, np.arange(n), dt)
        mask = np.triu(np.full((n, n), -np.inf, dtype=dt), 1)
        group = c.n_heads // c.n_kv_heads
        kv = []
        for w in self.layers:
            h = rms_norm(x, w["attn_norm"], c.rms_eps)
            q = h @ w["wq"].T
            k = h @ w["wk"].T
            v = h @ w["wv"].T
            if c.qkv_bias:
                q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
            q = apply_rope(q.reshape(n, c.n_heads, c.head_dim), cos, sin)
            k = apply_rope(k.reshape(n, c.n_kv_heads, c.head_dim), cos, sin)
            v = v.reshape(n, c.n_kv_heads, c.head_dim)
            if return_kv:
                kv.append((k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()))
            out = np.empty((n, c.n_heads, c.head_dim), dtype=dt)
            for hq in range(c.n_heads):
                hk = hq // group
                s = (q[:, hq, :] @ k[:, hk, :].T) / np.sqrt(c.head_dim) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hq, :] = s @ v[:, hk, :]
            x = x + out.reshape(n, -1) @ w["wo"].T
            h = rms_norm(x, w["ffn_norm"], c.rms_eps)
            g = h @ w["w_gate"].T
            x = x + ((g / (1.0 + np.exp(-g))) * (h @ w["w_up"].T)) @ w["w_down"].T
        x = rms_norm(x if all_logits else x[-1:], self.out_norm, c.rms_eps)
        logits = (x.astype(np.float32) @ self.lm_head.T).astype(np.float64)
        logits = logits if all_logits else logits[0]
        return (logits, kv) if return_kv else logits
