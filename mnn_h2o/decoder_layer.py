"""The Llama-family decoder layer, stated once for the three places that build or run it.

A layer is two halves around attention, which each caller runs its own way (our native core
behind the engine's modules, MNN's fused Attention op in the stock baseline, a numpy softmax in
the reference)::

    start_layer:   x = RMSNorm(h);  q = RoPE(x Wq + bq);  k = RoPE(x Wk + bk);  v = x Wv + bv
                   (the biases where the model has them: Qwen2)
    (attention)    attn = softmax(q k^T / sqrt(head_dim) + causal mask) v, per head
    finish_layer:  h = h + attn Wo;  x = RMSNorm(h);  h = h + (SiLU(x Wgate) * x Wup) Wdown

and where the architecture's form says so (mnn_h2o/architecture.py; Gemma 3): q and k each
RMS-normed per head before RoPE (qk_norm); attn Wo and the MLP's output RMS-normed before their
residual adds (post_norms); GELU (tanh) in place of SiLU (mlp geglu); sliding-window layers with
their own RoPE base (global_every, local_rope_base: the attention's window is the caller's).

The halves are written against ``LayerOps``, one implementation per backend: ``_ModuleOps`` in
mnn_h2o/export.py, ``_StockOps`` in mnn_h2o/stock_export.py (MNN.expr graphs, each in the layout
its attention takes) and ``NumpyOps`` in mnn_h2o/numpy_ops.py (the reference model's and the
native tail's). Values also meet through ``+``
and ``*``, which MNN.expr Vars and numpy arrays both have.
"""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from .architecture import ARCHITECTURES, is_local, missing
from .errors import ModelFileError
from .gguf_model import ModelConfig

# The layer options these halves implement (mnn_h2o/architecture.py) with ops that have the
# first five primitives of LayerOps only (the MNN modules' ops: export.py, stock_export.py)...
BASIC = {"qkv_bias": ("false", "true"), "norm": ("rms",), "mlp": ("swiglu",), "qk_norm": ("false",),
         "post_norms": ("false",), "q_width": ("hidden",), "embedding_scale": ("none",), "global_every": ("0",),
         "local_rope_base": ("0.0",)}
# ... and with every primitive (numpy_ops.NumpyOps: the reference), Gemma 3's layer too. Each
# backend's check_form refuses a model with an option its table lacks, by name.
IMPLEMENTS = {**BASIC, "mlp": ("swiglu", "geglu"), "qk_norm": ("false", "true"), "post_norms": ("false", "true"),
              "q_width": ("hidden", "heads"), "embedding_scale": ("none", "sqrt_hidden"), "global_every": ("0", "6"),
              "local_rope_base": ("0.0", "10000.0")}


def check_form(cfg: ModelConfig, implements: Mapping[str, Sequence[str]] = IMPLEMENTS,
               who: str = "decoder_layer.py") -> None:
    """ModelFileError naming the options of the model's layer that ``implements`` lacks."""
    lacks = missing(cfg, implements)
    if lacks:
        raise ModelFileError(f"architecture {cfg.arch}: {who} does not implement {', '.join(lacks)}")


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

    def norm_heads(self, x, w, n_heads: int):
        """Rows of n_heads heads, each head RMS-normed and scaled by ``w`` [head_dim] (qk_norm)."""

    def gelu(self, x):
        """GELU, tanh approximation (mlp geglu)."""


def start_layer(ops: LayerOps, cfg: ModelConfig, w: dict, h, layer: int = 0):
    """The attention's inputs (q, k, v) of layer ``layer`` from the residual stream ``h``. ``w``:
    GgufModel.layer."""
    x = ops.rms_norm(h, w["attn_norm"])
    q = ops.linear(x, w["wq"], w.get("bq"))
    k = ops.linear(x, w["wk"], w.get("bk"))
    if ARCHITECTURES[cfg.arch].qk_norm:
        q, k = ops.norm_heads(q, w["q_norm"], cfg.n_heads), ops.norm_heads(k, w["k_norm"], cfg.n_kv_heads)
    if is_local(cfg, layer):
        q, k = ops.rope(q, cfg.n_heads, local=True), ops.rope(k, cfg.n_kv_heads, local=True)
    else:
        q, k = ops.rope(q, cfg.n_heads), ops.rope(k, cfg.n_kv_heads)
    v = ops.heads(ops.linear(x, w["wv"], w.get("bv")), cfg.n_kv_heads)
    return q, k, v


def finish_layer(ops: LayerOps, cfg: ModelConfig, w: dict, h, attn):
    """The residual stream after the layer, from ``h`` and the attention output ``attn``
    ([n, n_heads * head_dim] rows)."""
    form = ARCHITECTURES[cfg.arch]
    out = ops.linear(attn, w["wo"])
    h = h + (ops.rms_norm(out, w["post_attn_norm"]) if form.post_norms else out)
    x = ops.rms_norm(h, w["ffn_norm"])
    gate = ops.linear(x, w["w_gate"])
    up = ops.linear(x, w["w_up"])
    out = ops.linear((ops.gelu(gate) if form.mlp == "geglu" else ops.silu(gate)) * up, w["w_down"])
    return h + (ops.rms_norm(out, w["post_ffn_norm"]) if form.post_norms else out)
