"""Read a Llama-family GGUF file into an architecture description and HF-layout float weights.

Supported architectures: those mnn_h2o/architecture.py describes (``llama``: Llama, SmolLM;
``qwen2``: Q/K/V biases). Weights are
dequantised with the ``gguf`` package straight to the HF ``[out, in]`` layout. llama.cpp stores
the rows of ``attn_q``/``attn_k`` of ``llama`` models permuted for its interleaved RoPE; we undo
that so the rotate-half RoPE of the HF reference applies (qwen2 is stored unpermuted).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from .architecture import ARCHITECTURES
from .errors import ModelFileError

SUPPORTED_ARCHS = tuple(ARCHITECTURES)  # each one's layer: mnn_h2o/architecture.py

# Bounds on what a model file may claim. Far above any model we run, low enough that a damaged
# size field is refused before something is allocated or looped over from it.
_MAX_SIZE = (1 << 31) - 1   # the native core takes int sizes
_MAX_LAYERS = 1 << 12
_MAX_HEADS = 1 << 12
_MAX_CONTEXT = 1 << 24


@functools.lru_cache(maxsize=1)
def _kinds() -> dict:
    """GGUF value types allowed per kind (floats may be written as ints). gguf is imported on
    first use, like everywhere in this module, so importing mnn_h2o stays cheap."""
    from gguf import GGUFValueType as T

    ints = (T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64)
    floats = (T.FLOAT32, T.FLOAT64)
    return {"int": {(t,) for t in ints}, "float": {(t,) for t in floats + ints},
            "str": {(T.STRING,)}, "str_array": {(T.ARRAY, T.STRING)},
            "int_array": {(T.ARRAY, t) for t in ints}, "float_array": {(T.ARRAY, t) for t in floats},
            "bool": {(T.BOOL,)}}


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
    # Tokens a sliding-window layer attends to (architecture.py's global_every; 0: none). A default,
    # so exports made before it read as before.
    sliding_window: int = 0

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


# GGUF value types: sizes of the scalars (0-7, 10-12), 8 = string, 9 = array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS


def check_layout(path: str) -> None:
    """Walk the header, metadata and tensor infos and check every length, count and type
    against the bytes that are really there, before gguf.GGUFReader sees the file.

    The reader trusts those fields: the items of an array nested in an array are read one by
    one, and past the end of the file each read is an empty slice that raises nothing, so a
    count taken from damaged bytes (up to 2^64) is looped over: a hang (found by the fuzzer with
    a string array re-typed as an array of arrays). Here every count must fit in the bytes
    left, so the walk is bounded by the file size (40 ms for SmolLM2's 100k-token metadata)."""
    import mmap
    import struct

    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ModelFileError(f"{path} is not a readable GGUF file: empty") from None
    with data:
        size = len(data)
        pos = 0

        def fail(what: str):
            raise ModelFileError(f"{path} is not a readable GGUF file: {what} (at byte {pos})")

        if size < 24 or data[:4] != b"GGUF":
            fail("no GGUF header")
        version = struct.unpack_from("<I", data, 4)[0]
        end = "<" if version & 0xFFFF else ">"  # the reader's own byte-order test
        u32, u64 = struct.Struct(end + "I"), struct.Struct(end + "Q")

        def read(st):
            nonlocal pos
            if pos + st.size > size:
                fail("truncated")
            v = st.unpack_from(data, pos)[0]
            pos += st.size
            return v

        def skip(n: int, what: str):
            nonlocal pos
            if n > size - pos:
                fail(f"{what} of {n} bytes runs past the end of the file")
            pos += n

        def value(t: int, depth: int):
            if t in _SCALAR_BYTES:
                skip(_SCALAR_BYTES[t], "value")
            elif t == _GGUF_STRING:
                skip(read(u64), "string")
            elif t == _GGUF_ARRAY and depth < 2:
                item = read(u32)
                count = read(u64)
                least = _SCALAR_BYTES.get(item, 8 if item == _GGUF_STRING else 12)
                if item not in _SCALAR_BYTES and item not in (_GGUF_STRING, _GGUF_ARRAY):
                    fail(f"array of unknown type {item}")
                if count * least > size - pos:
                    fail(f"array of {count} items runs past the end of the file")
                if item in _SCALAR_BYTES:
                    skip(count * least, "array")
                else:
                    for _ in range(count):
                        value(item, depth + 1)
            else:
                fail(f"unknown or too deeply nested value type {t}")

        pos = 8
        n_tensors, n_kv = read(u64), read(u64)
        # Each metadata entry takes at least 8 + 4 + 1 bytes, each tensor info 8 + 4 + 8 + 4 + 8.
        if n_kv * 13 > size - pos or n_tensors * 32 > size - pos:
            fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {size} bytes")
        for _ in range(n_kv):
            skip(read(u64), "key")
            value(read(u32), 0)
        for _ in range(n_tensors):
            skip(read(u64), "tensor name")
            n_dims = read(u32)
            if not 1 <= n_dims <= _MAX_DIMS:
                fail(f"tensor with {n_dims} dimensions")
            elements = 1
            for _ in range(n_dims):
                d = read(u64)
                if not 1 <= d <= size:
                    fail(f"tensor dimension {d}")
                elements *= d
            if elements > 8 * size:  # more than 2 values per bit: cannot be stored in this file
                fail(f"tensor of {elements} values in a file of {size} bytes")
            read(u32)  # type: checked by the reader
            if read(u64) > size:
                fail("tensor data offset past the end of the file")


# Each layer's float vectors, by the name the layer's halves and the native layers use: the GGUF
# tensor (blk.N.<tensor>.weight), its length, and the LayerForm option that brings it (None:
# every layer has it).
LAYER_VECTORS = {"attn_norm": ("attn_norm", "hidden", None), "ffn_norm": ("ffn_norm", "hidden", None),
                 "q_norm": ("attn_q_norm", "head_dim", "qk_norm"), "k_norm": ("attn_k_norm", "head_dim", "qk_norm"),
                 "post_attn_norm": ("post_attention_norm", "hidden", "post_norms"),
                 "post_ffn_norm": ("post_ffw_norm", "hidden", "post_norms")}


def layer_vectors(c: "ModelConfig") -> Dict[str, Tuple[str, int]]:
    """The vectors of LAYER_VECTORS a model's layers have: name -> (GGUF tensor, length)."""
    form = ARCHITECTURES[c.arch]
    return {name: (tensor, getattr(c, width)) for name, (tensor, width, option) in LAYER_VECTORS.items()
            if option is None or getattr(form, option)}


def expected_shapes(c: "ModelConfig") -> Dict[str, Tuple[int, ...]]:
    """HF-layout shape of every tensor the loader uses, from the config (output.weight and the
    q/k/v biases are optional)."""
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    vectors = layer_vectors(c)
    shapes = {"token_embd.weight": (c.vocab, c.hidden), "output_norm.weight": (c.hidden,),
              "output.weight": (c.vocab, c.hidden)}
    for i in range(c.n_layers):
        b = f"blk.{i}."
        shapes.update({b + "attn_q.weight": (q, c.hidden),
                       b + "attn_k.weight": (kv, c.hidden), b + "attn_v.weight": (kv, c.hidden),
                       b + "attn_output.weight": (c.hidden, q),
                       b + "ffn_gate.weight": (c.ffn, c.hidden), b + "ffn_up.weight": (c.ffn, c.hidden),
                       b + "ffn_down.weight": (c.hidden, c.ffn)})
        shapes.update({f"{b}{tensor}.weight": (n,) for tensor, n in vectors.values()})
        if c.qkv_bias:
            shapes.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
    return shapes


class GgufModel:
    """Lazy view of a GGUF model: config and tokenizer metadata now, tensors on request."""

    def __init__(self, path: str):
        import gguf

        if not os.path.isfile(path):
            raise ModelFileError(f"model file not found: {path}")
        check_layout(path)
        try:
            self.reader = gguf.GGUFReader(path)
        except Exception as e:  # the gguf package raises assorted types on damaged files
            raise ModelFileError(f"{path} is not a readable GGUF file: {e}") from None
        self.path = path
        self.fields = self.reader.fields
        arch = self._get("general.architecture", kind="str")
        if arch not in SUPPORTED_ARCHS:
            raise ModelFileError(
                f"{path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        self.tensors = {t.name: t for t in self.reader.tensors}
        # GGUF aligns every tensor's data; an offset off the grid is damage, and reading from it
        # would give shifted bytes that decode to plausible-looking garbage weights.
        align = int(self.reader.alignment)
        for t in self.reader.tensors:
            if (t.data_offset - self.reader.data_offset) % align:
                raise ModelFileError(f"{path}: tensor {t.name} data offset {t.data_offset} is not "
                                     f"aligned to {align} bytes")
        self.config = self._read_config(arch)

    def _get(self, key, default=KeyError, kind: str = "any"):
        """The value of metadata ``key``; with ``kind`` (int, float, str, str_array, int_array)
        its GGUF type is checked too, so a damaged file cannot hand a list or a string to the
        code that sizes the model."""
        f = self.fields.get(key)
        if f is None:
            if default is KeyError:
                raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is missing")
            return default
        types = tuple(f.types)
        if kind != "any" and types not in _kinds()[kind]:
            got = "[".join(getattr(t, "name", str(t)) for t in types) + "]" * (len(types) - 1)
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} must be {kind.replace('_', ' ')}, "
                                 f"got {got or 'nothing'}")
        try:
            v = f.contents()
        except Exception as e:
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is unreadable: {e}") from None
        if kind == "float" and not math.isfinite(v):
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is {v}")
        return v

    def _size(self, key: str, default=KeyError, lo: int = 1, hi: int = _MAX_SIZE) -> int:
        """An integer size in [lo, hi]: zero, negative or absurd sizes are a damaged file."""
        v = self._get(key, default, "int")
        if not lo <= v <= hi:
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} = {v} is out of range [{lo}, {hi}]")
        return int(v)

    def _positive_float(self, key: str, default=KeyError) -> float:
        v = float(self._get(key, default, "float"))
        if not v > 0:
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} = {v} must be > 0")
        return v

    def _read_config(self, arch: str) -> ModelConfig:
        p = arch + "."
        n_heads = self._size(p + "attention.head_count", hi=_MAX_HEADS)
        hidden = self._size(p + "embedding_length")
        form = ARCHITECTURES[arch]
        # attention.key_length where the file states it (Gemma 3: 256 beside a hidden size of 640)
        head_dim = self._size(p + "attention.key_length", 0, lo=0) or self._size(
            p + "rope.dimension_count", max(hidden // n_heads, 1))
        if p + "vocab_size" in self.fields:
            vocab = self._size(p + "vocab_size")
        else:
            vocab = len(self._get("tokenizer.ggml.tokens", kind="str_array"))
            if vocab < 1:
                raise ModelFileError(f"{self.path}: the vocabulary (tokenizer.ggml.tokens) is empty")
        token_id = lambda key: self._size(key, -1, lo=-1, hi=vocab - 1)  # noqa: E731 (-1: none)
        name = self._get("general.name", os.path.basename(self.path))
        cfg = ModelConfig(
            arch=arch,
            n_layers=self._size(p + "block_count", hi=_MAX_LAYERS),
            hidden=hidden,
            ffn=self._size(p + "feed_forward_length"),
            n_heads=n_heads,
            n_kv_heads=self._size(p + "attention.head_count_kv", n_heads, hi=_MAX_HEADS),
            head_dim=head_dim,
            vocab=vocab,
            context=self._size(p + "context_length", hi=_MAX_CONTEXT),
            rope_theta=self._positive_float(p + "rope.freq_base", 10000.0),
            rms_eps=self._positive_float(p + "attention.layer_norm_rms_epsilon"),
            tied_embeddings="output.weight" not in self.tensors,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
            bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_token_id=token_id("tokenizer.ggml.eos_token_id"),
            name=name if isinstance(name, str) else os.path.basename(self.path),
            sliding_window=self._size(p + "attention.sliding_window") if form.global_every else 0,
        )
        # head_dim must be even: RoPE rotates halves and llama's q/k rows are un-permuted in pairs.
        q_ok = cfg.n_heads * cfg.head_dim == cfg.hidden or form.q_width == "heads"
        if not q_ok or cfg.n_heads % cfg.n_kv_heads or cfg.head_dim % 2:
            raise ModelFileError(f"{self.path}: inconsistent head layout {cfg}")
        if p + "attention.value_length" in self.fields and self._size(p + "attention.value_length") != head_dim:
            raise ModelFileError(f"{self.path}: value rows of {self._size(p + 'attention.value_length')} values "
                                 f"beside keys of {head_dim} (one head_dim is supported)")
        for name, shape in expected_shapes(cfg).items():
            t = self.tensors.get(name)
            if t is None:
                if name == "output.weight":
                    continue  # absent: the lm_head is tied to the embedding
                raise ModelFileError(f"{self.path}: tensor {name} is missing")
            got = tuple(int(x) for x in reversed(t.shape))
            if got != shape:
                raise ModelFileError(f"{self.path}: tensor {name} has shape {got}, the config says {shape}")
        return cfg

    # --- tensors -----------------------------------------------------------------------------
    # Values per call of gguf's decoder. Its k-quant decoders hold temporaries several times the
    # size of what they return: over a whole 151936 x 1536 Q6_K matrix at once that was most of
    # the 1.5B export's 11.7 GB peak. In slices of rows the temporaries stay a few tens of MB.
    _DECODE_VALUES = 1 << 22

    def tensor(self, name: str) -> np.ndarray:
        """Dequantised float32 tensor in HF layout ([out, in] for matrices)."""
        return self.tensor_rows(name)

    def tensor_rows(self, name: str, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """Rows [start, stop) of a dequantised float32 tensor in HF layout (a matrix's output rows;
        a vector is one row: only the whole of it)."""
        import gguf

        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name!r} is missing")
        expect = tuple(int(x) for x in reversed(t.shape))
        data = np.asarray(t.data)
        rows = expect[0] if len(expect) == 2 and data.ndim == 2 and data.shape[0] == expect[0] else None
        if rows is None:  # not a matrix the reader gives row by row: decoded whole
            if (start, stop) not in ((0, None), (0, 1)):
                raise ValueError(f"tensor {name!r} of shape {expect} is read whole")
            start, stop, step, out_shape = 0, 1, 1, expect
        else:
            stop = rows if stop is None else stop
            if not 0 <= start <= stop <= rows:
                raise ValueError(f"rows [{start}, {stop}) of tensor {name!r}, which has {rows}")
            step = max(1, self._DECODE_VALUES // max(1, expect[1]))
            out_shape = (stop - start, expect[1])
        out = np.empty(out_shape, np.float32)
        flat = out.reshape(-1)
        at = 0
        for r in range(start, stop, step):
            part = data if rows is None else data[r:min(stop, r + step)]
            try:
                w = np.asarray(gguf.quants.dequantize(part, t.tensor_type), np.float32).reshape(-1)
            except Exception as e:
                raise ModelFileError(f"{self.path}: tensor {name!r} cannot be decoded: {e}") from None
            if at + w.size > flat.size or (rows is not None and w.size != part.shape[0] * expect[1]):
                raise ModelFileError(f"{self.path}: tensor {name!r} does not hold the values of shape {expect}")
            flat[at:at + w.size] = w
            at += w.size
        if at != flat.size:
            raise ModelFileError(f"{self.path}: tensor {name!r} has {at} values, expected shape {expect}")
        if not np.all(np.isfinite(out)):
            raise ModelFileError(f"{self.path}: tensor {name!r} contains NaN or Inf")
        return out

    # Block-32 GGUF types as (codes, fp16 scale, fp16 min) per block: ggml's block_q8_0 {d, qs[32]},
    # block_q4_0 {d, qs[16]} (value (nibble - 8) * d), block_q4_1 {d, m, qs[16]} (nibble * d + m)
    # and block_q5_0 {d, qh[4], qs[16]} ((nibble + 16 bit - 16) * d, bit j of qh as one
    # little-endian word); nibble j of a block is qs[j] & 15 for j < 16, qs[j - 16] >> 4 after.
    _BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22}

    def blocks(self, name: str) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The stored blocks of a Q8_0 / Q4_0 / Q4_1 / Q5_0 matrix (not for the permuted Q/K): int8 codes
        [out, in], fp16 scales and mins [out, in / 32], whose ``codes * scale + min`` are exactly
        :meth:`tensor`'s values (checked); None for any other type."""
        t = self.tensors.get(name)
        kind = t.tensor_type.name if t is not None else None
        if kind not in self._BLOCK_BYTES:
            return None
        w = self.tensor(name)
        if w.ndim != 2 or w.shape[1] % 32:
            return None
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        nb = w.shape[1] // 32
        if raw.size != w.shape[0] * nb * self._BLOCK_BYTES[kind]:
            raise ModelFileError(f"{self.path}: tensor {name!r} holds {raw.size} bytes, not {w.shape} in {kind} blocks")
        raw = raw.reshape(w.shape[0], nb, self._BLOCK_BYTES[kind])
        scales = np.ascontiguousarray(raw[..., 0:2]).view(np.float16)[..., 0]
        mins = np.zeros_like(scales)
        if kind == "Q8_0":
            codes = raw[..., 2:].view(np.int8)
        else:
            qs = raw[..., {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6}[kind]:]
            codes = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int8)
            if kind == "Q4_1":
                mins = np.ascontiguousarray(raw[..., 2:4]).view(np.float16)[..., 0]
            elif kind == "Q5_0":
                qh = np.ascontiguousarray(raw[..., 2:6]).view("<u4")
                codes += (((qh >> np.arange(32, dtype=np.uint32)) & 1) * 16).astype(np.int8) - 16
            else:
                codes -= 8
        values = codes * scales.astype(np.float32)[..., None] + mins.astype(np.float32)[..., None]
        if not np.array_equal(values.reshape(w.shape), w):
            raise ModelFileError(f"{self.path}: tensor {name!r}: its {kind} blocks do not decode to its values")
        return np.ascontiguousarray(codes.reshape(w.shape)), scales, mins

    def weight_blocks(self, name: str, heads: Optional[int] = None) -> Tuple[str, np.ndarray]:
        """A matrix's blocks as the file stores them: (ggml type name, uint8 [out, row bytes]),
        row sizes from the core's weight types (native/include/mnn_h2o/dense/weight_types.h).
        ``heads``: the rows un-permuted as :meth:`layer` does for Q and K (a row permutation of
        whole rows of blocks). ModelFileError for a type the core does not read, naming it."""
        from . import native

        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name!r} is missing")
        kind = t.tensor_type.name
        traits = {w["name"]: w for w in native.weight_types()}
        if kind not in traits:
            raise ModelFileError(f"{self.path}: tensor {name!r} is {kind}, a weight type the native core does not "
                                 f"read (it reads {', '.join(traits)})")
        rows, cols = (int(x) for x in reversed(t.shape))
        tr = traits[kind]
        if cols % tr["block_values"]:
            raise ModelFileError(f"{self.path}: tensor {name!r}: rows of {cols} values are not whole {kind} blocks")
        row_bytes = cols // tr["block_values"] * tr["block_bytes"]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        if raw.size != rows * row_bytes:
            raise ModelFileError(f"{self.path}: tensor {name!r} holds {raw.size} bytes, not {rows} rows of "
                                 f"{row_bytes} ({kind})")
        raw = raw.reshape(rows, row_bytes)
        if heads is not None:
            raw = raw[self._unpermute(np.arange(rows), heads)]
        return kind, np.ascontiguousarray(raw)

    # GGUF types whose values block-32 int4 (MNN's converter) holds: 4-bit codes, one scale (and
    # offset) per block of 32. Anything else (Q8_0, k-quants, f16, ...) is exported at 8 bits.
    _FOUR_BIT_TYPES = ("Q4_0", "Q4_1")

    def stored_bits(self) -> Tuple[int, int]:
        """(layers, output projection): 4 where every matrix of the group is stored as 4-bit
        blocks of 32 in this file, else 8 — the fewest export bits that keep the file's weights."""
        head = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        mats = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        layers = [f"blk.{i}.{m}.weight" for i in range(self.config.n_layers) for m in mats]
        bits = lambda names: 4 if all(self.tensors[n].tensor_type.name in self._FOUR_BIT_TYPES
                                      for n in names if n in self.tensors) else 8
        return bits(layers), bits([head])

    def _unpermute(self, w: np.ndarray, n_head: int) -> np.ndarray:
        if not ARCHITECTURES[self.config.arch].permuted_qk:
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
            "wq": self._unpermute(g("attn_q.weight"), c.n_heads),
            "wk": self._unpermute(g("attn_k.weight"), c.n_kv_heads),
            "wv": g("attn_v.weight"),
            "wo": g("attn_output.weight"),
            "w_gate": g("ffn_gate.weight"),
            "w_up": g("ffn_up.weight"),
            "w_down": g("ffn_down.weight"),
        }
        d.update((name, g(f"{tensor}.weight")) for name, (tensor, _) in layer_vectors(c).items())
        if c.qkv_bias:
            d["bq"], d["bk"], d["bv"] = self.qkv_biases(i)
        return d

    def qkv_biases(self, i: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer ``i``'s Q, K and V biases (architectures with ``qkv_bias``), un-permuted as
        :meth:`layer`'s rows are."""
        c = self.config
        g = lambda n: self.tensor(f"blk.{i}.{n}")
        return (self._unpermute(g("attn_q.bias"), c.n_heads), self._unpermute(g("attn_k.bias"), c.n_kv_heads),
                g("attn_v.bias"))

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
        """The tokenizer as the file states it: byte-level BPE (``tokenizer.ggml.model`` gpt2: its
        merges) or SentencePiece (llama: each piece's score, mnn_h2o/tokenizer.py)."""
        model = self._get("tokenizer.ggml.model", kind="str")
        if model not in ("gpt2", "llama"):
            raise ModelFileError(f"{self.path}: tokenizer model {model!r} is not supported (byte-level BPE "
                                 "'gpt2' or SentencePiece 'llama')")
        c = self.config
        tokens = self._get("tokenizer.ggml.tokens", kind="str_array")
        token_type = self._get("tokenizer.ggml.token_type", kind="int_array")
        # Token ids index the embedding: a vocabulary longer than it, or special ids past the
        # vocabulary, would only fail at run time, on some prompt.
        if not 0 < len(tokens) <= c.vocab:
            raise ModelFileError(f"{self.path}: {len(tokens)} tokens for an embedding of {c.vocab} rows")
        if len(token_type) != len(tokens):
            raise ModelFileError(f"{self.path}: {len(token_type)} token types for {len(tokens)} tokens")
        for key, i in (("bos", c.bos_token_id), ("eos", c.eos_token_id)):
            if i >= len(tokens):
                raise ModelFileError(f"{self.path}: {key} token id {i} is past the {len(tokens)} tokens")
        meta = {
            "model": model,
            "tokens": list(tokens),
            "token_type": [int(x) for x in token_type],
            "bos_token_id": c.bos_token_id,
            "eos_token_id": c.eos_token_id,
            "chat_template": self._get("tokenizer.chat_template", None, kind="str"),
            # whether a sequence starts with BOS (llama.cpp's tokenize(add_bos) default; Gemma's does)
            "add_bos_token": bool(self._get("tokenizer.ggml.add_bos_token", False, kind="bool")),
        }
        if model == "gpt2":
            merges = self._get("tokenizer.ggml.merges", kind="str_array")
            bad = next((m for m in merges if len(m.split(" ")) != 2 or "" in m.split(" ")), None)
            if bad is not None:
                raise ModelFileError(f"{self.path}: BPE merge {bad!r} is not two tokens separated by a space")
            meta.update(pre=self._get("tokenizer.ggml.pre", "default", kind="str"), merges=list(merges))
        else:
            scores = self._get("tokenizer.ggml.scores", kind="float_array")
            if len(scores) != len(tokens) or not all(math.isfinite(x) for x in scores):
                raise ModelFileError(f"{self.path}: {len(scores)} piece scores for {len(tokens)} tokens, or one "
                                     "not finite")
            # llama.cpp's default for a SentencePiece file that does not say
            meta.update(scores=[float(x) for x in scores],
                        add_space_prefix=bool(self._get("tokenizer.ggml.add_space_prefix", True, kind="bool")))
        return meta
