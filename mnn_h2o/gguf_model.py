"""Read a Llama-family GGUF file into an architecture description and HF-layout float weights.

Supported architectures: ``llama`` (Llama, SmolLM) and ``qwen2`` (Q/K/V biases). Weights are
dequantised with the ``gguf`` package straight to the HF ``[out, in]`` layout. llama.cpp stores
the rows of ``attn_q``/``attn_k`` of ``llama`` models permuted for its interleaved RoPE; we undo
that so the rotate-half RoPE of the HF reference applies (qwen2 is stored unpermuted).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Dict, Iterator, Tuple

import numpy as np

SUPPORTED_ARCHS = ("llama", "qwen2")


class ModelFileError(ValueError):
    """A model file that is missing, unreadable, corrupt or of an unsupported architecture."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    qkv_bias: bool
    bos_token_id: int
    eos_token_id: int
    name: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        return ModelConfig(**d)


def file_digest(path: str, chunk: int = 1 << 24) -> str:
    """sha256 of a file; used to key the export cache on the source bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


class GgufModel:
    """Lazy view of a GGUF model: config and tokenizer metadata now, tensors on request."""

    def __init__(self, path: str):
        import gguf

        if not os.path.isfile(path):
            raise ModelFileError(f"model file not found: {path}")
        try:
            self.reader = gguf.GGUFReader(path)
        except Exception as e:  # the gguf package raises assorted types on damaged files
            raise ModelFileError(f"{path} is not a readable GGUF file: {e}") from None
        self.path = path
        self.fields = self.reader.fields
        arch = self._get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ModelFileError(
                f"{path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.config = self._read_config(arch)

    def _get(self, key, default=KeyError):
        f = self.fields.get(key)
        if f is None:
            if default is KeyError:
                raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is missing")
            return default
        try:
            return f.contents()
        except Exception as e:
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is unreadable: {e}") from None

    def _read_config(self, arch: str) -> ModelConfig:
        p = arch + "."
        n_heads = int(self._get(p + "attention.head_count"))
        hidden = int(self._get(p + "embedding_length"))
        head_dim = int(self._get(p + "rope.dimension_count", hidden // n_heads))
        vocab = int(self._get(p + "vocab_size", 0)) or len(self.fields["tokenizer.ggml.tokens"].data)
        cfg = ModelConfig(
            arch=arch,
            n_layers=int(self._get(p + "block_count")),
            hidden=hidden,
            ffn=int(self._get(p + "feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=int(self._get(p + "attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            vocab=vocab,
            context=int(self._get(p + "context_length")),
            rope_theta=float(self._get(p + "rope.freq_base", 10000.0)),
            rms_eps=float(self._get(p + "attention.layer_norm_rms_epsilon")),
            tied_embeddings="output.weight" not in self.tensors,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
            bos_token_id=int(self._get("tokenizer.ggml.bos_token_id", -1)),
            eos_token_id=int(self._get("tokenizer.ggml.eos_token_id", -1)),
            name=str(self._get("general.name", os.path.basename(self.path))),
        )
        if cfg.n_heads * cfg.head_dim != cfg.hidden or cfg.n_heads % cfg.n_kv_heads:
            raise ModelFileError(f"{self.path}: inconsistent head layout {cfg}")
        for i in range(cfg.n_layers):
            for t in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                      "ffn_gate", "ffn_up", "ffn_down"):
                if f"blk.{i}.{t}.weight" not in self.tensors:
                    raise ModelFileError(f"{self.path}: tensor blk.{i}.{t}.weight is missing")
        return cfg

    # --- tensors -----------------------------------------------------------------------------
    def tensor(self, name: str) -> np.ndarray:
        """Dequantised float32 tensor in HF layout ([out, in] for matrices)."""
        import gguf

        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name!r} is missing")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ModelFileError(f"{self.path}: tensor {name!r} cannot be decoded: {e}") from None
        w = np.asarray(w, dtype=np.float32)
        expect = tuple(int(x) for x in reversed(t.shape))
        if w.size != int(np.prod(expect)):
            raise ModelFileError(f"{self.path}: tensor {name!r} has {w.size} values, expected shape {expect}")
        w = w.reshape(expect)
        if not np.all(np.isfinite(w)):
            raise ModelFileError(f"{self.path}: tensor {name!r} contains NaN or Inf")
        return w

    def _unpermute(self, w: np.ndarray, n_head: int) -> np.ndarray:
        if self.config.arch != "llama":
            return w
        hd = self.config.head_dim
        if w.ndim == 1:
            return w.reshape(n_head, hd // 2, 2).swapaxes(1, 2).reshape(w.shape)
        return w.reshape(n_head, hd // 2, 2, w.shape[-1]).swapaxes(1, 2).reshape(w.shape)

    def layer(self, i: int) -> Dict[str, np.ndarray]:
        """Weights of decoder layer ``i`` with HF-style short names."""
        c = self.config
        g = lambda n: self.tensor(f"blk.{i}.{n}")
        d = {
            "attn_norm": g("attn_norm.weight"),
            "wq": self._unpermute(g("attn_q.weight"), c.n_heads),
            "wk": self._unpermute(g("attn_k.weight"), c.n_kv_heads),
            "wv": g("attn_v.weight"),
            "wo": g("attn_output.weight"),
            "ffn_norm": g("ffn_norm.weight"),
            "w_gate": g("ffn_gate.weight"),
            "w_up": g("ffn_up.weight"),
            "w_down": g("ffn_down.weight"),
        }
        if c.qkv_bias:
            d["bq"] = self._unpermute(g("attn_q.bias"), c.n_heads)
            d["bk"] = self._unpermute(g("attn_k.bias"), c.n_kv_heads)
            d["bv"] = g("attn_v.bias")
        return d

    def layers(self) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
        for i in range(self.config.n_layers):
            yield i, self.layer(i)

    def embedding(self) -> np.ndarray:
        return self.tensor("token_embd.weight")

    def output_norm(self) -> np.ndarray:
        return self.tensor("output_norm.weight")

    def lm_head(self) -> np.ndarray:
        return self.embedding() if self.config.tied_embeddings else self.tensor("output.weight")

    # --- tokenizer metadata ------------------------------------------------------------------
    def tokenizer_metadata(self) -> dict:
        model = self._get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelFileError(f"{self.path}: tokenizer model {model!r} is not supported (byte-level BPE 'gpt2' only)")
        tokens = self._get("tokenizer.ggml.tokens")
        return {
            "pre": self._get("tokenizer.ggml.pre", "default"),
            "tokens": list(tokens),
            "token_type": [int(x) for x in self._get("tokenizer.ggml.token_type")],
            "merges": list(self._get("tokenizer.ggml.merges")),
            "bos_token_id": self.config.bos_token_id,
            "eos_token_id": self.config.eos_token_id,
            "chat_template": self._get("tokenizer.chat_template", None),
        }
