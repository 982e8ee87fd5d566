"""Each model architecture's decoder layer, described once as options of the one layer that
decoder_layer.py states.

The implementations of that layer (decoder_layer.py's halves, which the numpy reference and the
MNN export run, and the native decode layers of native/src/dense/decode_layers.cpp) each say
which values of each option they implement: ``decoder_layer.IMPLEMENTS``, and the core's own
table for the native layers (``native.decode_layer_options()``). A model whose options an
implementation lacks is refused there by name, so a new architecture cannot run with another
one's math: GgufModel refuses an architecture not described here, the reference and the export
one decoder_layer.py does not implement, and the export writes no native decode layers for one
the core does not implement (``runtime.decode_layers native`` then says why).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class LayerForm:
    """What one architecture's decoder layer is made of (whether its Q, K and V projections have
    biases is the file's: Qwen2's do, and llama.cpp's llama files may)."""

    # llama.cpp stored the Q / K rows permuted for its interleaved RoPE (llama): GgufModel
    # un-permutes them on load, so every implementation rotates halves.
    permuted_qk: bool
    # The norm before attention and before the MLP.
    norm: str = "rms"
    # The MLP: SiLU(x Wgate) * x Wup, then Wdown.
    mlp: str = "swiglu"
    # An RMSNorm of each head's q and k before RoPE (Gemma 3, Qwen3).
    qk_norm: bool = False
    # Norms after attention and after the MLP too, before each residual add (Gemma's "sandwich").
    post_norms: bool = False
    # The width of the Q rows and of the attention output: "hidden" (heads x head_dim is the hidden
    # size) or "heads" (heads x head_dim on its own: Gemma 3 270M's 4 x 256 beside 640).
    q_width: str = "hidden"
    # The embedding row times sqrt(hidden) before the first layer ("sqrt_hidden": Gemma), or not.
    embedding_scale: str = "none"
    # Sliding-window layers: every layer but each global_every-th one (layers global_every - 1,
    # 2 global_every - 1, ...) attends to the newest `attention.sliding_window` tokens only, and
    # rotates by RoPE base local_rope_base; 0: every layer global, one base.
    global_every: int = 0
    local_rope_base: float = 0.0

    def options(self, qkv_bias: bool) -> Dict[str, str]:
        """The layer's options as the implementations' tables name them, for a file with or without
        Q/K/V biases (permuted_qk is the loader's, not the layer's: every implementation sees
        un-permuted rows)."""
        out = {"qkv_bias": _text(qkv_bias)}
        out.update((f.name, _text(getattr(self, f.name))) for f in dataclasses.fields(self) if f.name != "permuted_qk")
        return out


ARCHITECTURES: Dict[str, LayerForm] = {
    "llama": LayerForm(permuted_qk=True),    # Llama, SmolLM
    "qwen2": LayerForm(permuted_qk=False),
    # Gemma 3: GELU (tanh) gating, q/k norms, sandwich norms; five sliding-window layers of every
    # six, whose RoPE base is 10000 (llama.cpp's gemma3 constants: neither is in the file).
    "gemma3": LayerForm(permuted_qk=False, mlp="geglu", qk_norm=True, post_norms=True, q_width="heads",
                        embedding_scale="sqrt_hidden", global_every=6, local_rope_base=10000.0),
}


def _text(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def is_local(cfg, layer: int) -> bool:
    """Whether ``layer`` is a sliding-window one (attends to the newest cfg.sliding_window tokens,
    rotates by local_rope_base): every layer but each global_every-th."""
    every = ARCHITECTURES[cfg.arch].global_every
    return bool(every) and (layer + 1) % every != 0


def layer_options(cfg) -> Dict[str, str]:
    """A model's layer options (cfg: gguf_model.ModelConfig)."""
    return ARCHITECTURES[cfg.arch].options(cfg.qkv_bias)


def missing(cfg, implemented: Mapping[str, Sequence[str]]) -> List[str]:
    """The options of a model's layer that ``implemented`` lacks, as "name value" (empty: it runs)."""
    return [f"{k} {v}" for k, v in layer_options(cfg).items() if v not in implemented.get(k, ())]
