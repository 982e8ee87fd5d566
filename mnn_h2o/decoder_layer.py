"""The Llama-family decoder layer, stated once for the three places that build or run it.

A layer is two halves around attention, which each caller runs its own way (our native core
behind the engine's modules, MNN's fused Attention op in the stock baseline, a numpy softmax in
the reference)::

    start_layer:   x = RMSNorm(h);  q = RoPE(x Wq + bq);  k = RoPE(x Wk + bk);  v = x Wv + bv
                   (the biases where the model has them: Qwen2)
    (attention)    attn = softmax(q k^T / sqrt(head_dim) + causal mask) v, per head
    finish_layer:  h = h + attn Wo;  x = RMSNorm(h);  h = h + (SiLU(x Wgate) * x Wup) Wdown

The halves are written against ``LayerOps``, one implementation per backend: ``_ModuleOps`` in
mnn_h2o/export.py, ``_StockOps`` in mnn_h2o/stock_export.py (MNN.expr graphs, each in the layout
its attention takes) and ``NumpyOps`` in mnn_h2o/numpy_ops.py (the reference model's and the
native tail's). Values also meet through ``+``
and ``*``, which MNN.expr Vars and numpy arrays both have.
"""
from __future__ import annotations

from typing import Protocol

from .architecture import missing
from .errors import ModelFileError
from .gguf_model import ModelConfig

# The layer options these halves implement (mnn_h2o/architecture.py): the numpy reference and the
# MNN export refuse a model with any other (check_form).
IMPLEMENTS = {"qkv_bias": ("false", "true"), "norm": ("rms",), "mlp": ("swiglu",), "qk_norm": ("false",),
              "post_norms": ("false",)}


def check_form(cfg: ModelConfig) -> None:
    """ModelFileError naming the options of the model's layer that these halves lack."""
    lacks = missing(cfg, IMPLEMENTS)
    if lacks:
        raise ModelFileError(f"architecture {cfg.arch}: decoder_layer.py does not implement {', '.join(lacks)}")


class LayerOps(Protocol):
    """A backend's primitives; it holds what they need besides weights (epsilon, RoPE tables)."""

    def rms_norm(self, x, w):
        """RMSNorm over the last axis, scaled by ``w``."""

    def linear(self, x, w, b=None):
        """``x @ w.T (+ b)``; ``w`` is [out, in], as the GGUF stores it."""

    def rope(self, x, n_heads: int):
        """A projection's rows, rotate-half RoPE per head, in the layout the attention takes."""

    def heads(self, x, n_heads: int):
        """A projection's rows in the layout the attention takes, without RoPE (for V)."""

    def silu(self, x):
        """x * sigmoid(x)."""


def start_layer(ops: LayerOps, cfg: ModelConfig, w: dict, h):
    """The attention's inputs (q, k, v) from the residual stream ``h``. ``w``: GgufModel.layer."""
    x = ops.rms_norm(h, w["attn_norm"])
    q = ops.rope(ops.linear(x, w["wq"], w.get("bq")), cfg.n_heads)
    k = ops.rope(ops.linear(x, w["wk"], w.get("bk")), cfg.n_kv_heads)
    v = ops.heads(ops.linear(x, w["wv"], w.get("bv")), cfg.n_kv_heads)
    return q, k, v


def finish_layer(ops: LayerOps, w: dict, h, attn):
    """The residual stream after the layer, from ``h`` and the attention output ``attn``
    ([n, n_heads * head_dim] rows)."""
    h = h + ops.linear(attn, w["wo"])
    x = ops.rms_norm(h, w["ffn_norm"])
    gate = ops.linear(x, w["w_gate"])
    up = ops.linear(x, w["w_up"])
    return h + ops.linear(ops.silu(gate) * up, w["w_down"])
