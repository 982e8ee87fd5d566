"""Hostile variants of a tiny valid GGUF model, for fuzzing the model loader.

The seed is a two-layer llama-shaped model (hidden 32, GQA 4/2 heads, a byte-level BPE
tokenizer of 48 tokens, F32/F16/Q8_0 tensors) written with the ``gguf`` package's GGUFWriter: a
few tens of KB, so thousands of variants load in seconds. Variants come in two families:

- byte level, guided by a walk of the GGUF layout (:func:`layout`) so that the fields that size
  things (string lengths, array counts, tensor ranks, dims and data offsets, value types) get
  hostile values (0, 2^32, 2^63, 2^64-1, past EOF, misaligned), plus truncation, random bit
  flips and duplicated metadata entries;
- semantic, rewritten with GGUFWriter: a key the loader reads given a value of the wrong type
  (string, float NaN/inf, huge or negative int, bool, arrays, nested arrays), a missing key,
  zero/negative/huge sizes, tensors with the wrong shape, type or NaN data.

Every variant is a ``Mutation`` (kind + bytes); the kind names which mutator made it so a finding
says what kind of damage triggered it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

# --- the seed model ---------------------------------------------------------------------------
HIDDEN, FFN, N_HEADS, N_KV_HEADS, N_LAYERS, CONTEXT = 32, 64, 4, 2, 2, 64
HEAD_DIM = HIDDEN // N_HEADS
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_PLAIN = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "ab", "Ġa", "Ġab", "cd", "ef",
                                                             "gh", "ij", "kl", "mn", "op", "qr",
                                                             "st", "uv", "wx", "yz", "th", "he",
                                                             "in"]
TOKENS = _SPECIAL + _PLAIN
MERGES = ["a b", "Ġ a", "Ġa b", "c d", "e f", "g h", "i j", "k l", "m n", "o p", "q r", "s t",
          "u v", "w x", "y z", "t h", "h e", "i n"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class KV(NamedTuple):
    key: str
    value: Any
    vtype: Any            # gguf.GGUFValueType
    sub_type: Any = None  # element type of an array


class Tensor(NamedTuple):
    name: str
    array: np.ndarray     # float32, numpy (HF) layout [out, in]
    qtype: Any            # gguf.GGMLQuantizationType


def seed_spec() -> Tuple[List[KV], List[Tensor]]:
    """Metadata and tensors of the seed model, as lists the semantic mutators edit."""
    from gguf import GGMLQuantizationType as Q, GGUFValueType as T

    p = "llama."
    kv = [
        KV("general.name", "fuzz-seed", T.STRING),
        KV(p + "block_count", N_LAYERS, T.UINT32),
        KV(p + "context_length", CONTEXT, T.UINT32),
        KV(p + "embedding_length", HIDDEN, T.UINT32),
        KV(p + "feed_forward_length", FFN, T.UINT32),
        KV(p + "attention.head_count", N_HEADS, T.UINT32),
        KV(p + "attention.head_count_kv", N_KV_HEADS, T.UINT32),
        KV(p + "rope.dimension_count", HEAD_DIM, T.UINT32),
        KV(p + "rope.freq_base", 10000.0, T.FLOAT32),
        KV(p + "attention.layer_norm_rms_epsilon", 1e-5, T.FLOAT32),
        KV(p + "vocab_size", len(TOKENS), T.UINT32),
        KV("tokenizer.ggml.model", "gpt2", T.STRING),
        KV("tokenizer.ggml.pre", "smollm", T.STRING),
        KV("tokenizer.ggml.tokens", TOKENS, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.token_type", [3] * len(_SPECIAL) + [1] * len(_PLAIN), T.ARRAY, T.INT32),
        KV("tokenizer.ggml.merges", MERGES, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.bos_token_id", 1, T.UINT32),
        KV("tokenizer.ggml.eos_token_id", 2, T.UINT32),
        KV("tokenizer.chat_template", CHAT_TEMPLATE, T.STRING),
    ]
    rng = np.random.default_rng(1234)
    w = lambda *shape: (rng.standard_normal(shape) * 0.1).astype(np.float32)  # noqa: E731
    kvd = N_KV_HEADS * HEAD_DIM
    tensors = [Tensor("token_embd.weight", w(len(TOKENS), HIDDEN), Q.Q8_0),
               Tensor("output_norm.weight", 1 + w(HIDDEN), Q.F32)]
    for i in range(N_LAYERS):
        b = f"blk.{i}."
        tensors += [Tensor(b + "attn_norm.weight", 1 + w(HIDDEN), Q.F32),
                    Tensor(b + "attn_q.weight", w(HIDDEN, HIDDEN), Q.F16),
                    Tensor(b + "attn_k.weight", w(kvd, HIDDEN), Q.Q8_0),
                    Tensor(b + "attn_v.weight", w(kvd, HIDDEN), Q.F32),
                    Tensor(b + "attn_output.weight", w(HIDDEN, HIDDEN), Q.F16),
                    Tensor(b + "ffn_norm.weight", 1 + w(HIDDEN), Q.F32),
                    Tensor(b + "ffn_gate.weight", w(FFN, HIDDEN), Q.Q8_0),
                    Tensor(b + "ffn_up.weight", w(FFN, HIDDEN), Q.Q8_0),
                    Tensor(b + "ffn_down.weight", w(HIDDEN, FFN), Q.Q8_0)]
    return kv, tensors


def write_gguf(kv: List[KV], tensors: List[Tensor], arch: str = "llama") -> bytes:
    """The bytes of a GGUF file with this metadata and these tensors."""
    import gguf

    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(path, arch)
        for e in kv:
            w.add_key_value(e.key, e.value, e.vtype, e.sub_type)
        for t in tensors:
            if t.qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                a = t.array.astype(np.float16 if t.qtype == gguf.GGMLQuantizationType.F16 else np.float32)
                w.add_tensor(t.name, a)
            else:
                q = gguf.quants.quantize(t.array, t.qtype)
                w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.remove(path)


@functools.lru_cache(maxsize=1)
def seed_bytes() -> bytes:
    kv, tensors = seed_spec()
    return write_gguf(kv, tensors)


# --- the layout walk --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Slot:
    """A fixed-width little-endian integer field of the file that sizes or types something."""
    offset: int
    width: int      # bytes: 4 or 8
    kind: str       # n_tensors, n_kv, key_len, value_type, str_len, array_type, array_count,
                    # n_dims, dim, tensor_type, tensor_offset
    owner: str      # the metadata key or tensor name it belongs to ("" for the header)


@dataclasses.dataclass(frozen=True)
class Layout:
    slots: Tuple[Slot, ...]
    kv_entries: Tuple[Tuple[int, int, str], ...]   # (start, end, key) of each metadata entry
    n_kv_offset: int
    data_start: int                                # first byte of tensor data


_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def layout(data: bytes, alignment: int = 32) -> Layout:
    """Walk a valid GGUF (v2/v3, little-endian) and record where its sizing fields are."""
    slots: List[Slot] = []
    entries = []
    pos = 0

    def u(width: int, kind: str, owner: str) -> int:
        nonlocal pos
        slots.append(Slot(pos, width, kind, owner))
        v = int.from_bytes(data[pos:pos + width], "little")
        pos += width
        return v

    def string(kind: str, owner: str) -> str:
        nonlocal pos
        n = u(8, kind, owner)
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t: int, owner: str) -> None:
        nonlocal pos
        if t == _STRING:
            string("str_len", owner)
        elif t == _ARRAY:
            et = u(4, "array_type", owner)
            for _ in range(u(8, "array_count", owner)):
                value(et, owner)
        else:
            pos += _SCALAR_SIZE[t]

    pos = 8  # magic, version
    n_tensors = u(8, "n_tensors", "")
    n_kv_offset = pos
    n_kv = u(8, "n_kv", "")
    for _ in range(n_kv):
        start = pos
        key = string("key_len", "")
        slots[-1] = dataclasses.replace(slots[-1], owner=key)
        value(u(4, "value_type", key), key)
        entries.append((start, pos, key))
    for _ in range(n_tensors):
        name = string("key_len", "")
        slots[-1] = dataclasses.replace(slots[-1], owner=name)
        for _ in range(u(4, "n_dims", name)):
            u(8, "dim", name)
        u(4, "tensor_type", name)
        u(8, "tensor_offset", name)
    data_start = (pos + alignment - 1) // alignment * alignment
    return Layout(tuple(slots), tuple(entries), n_kv_offset, data_start)


@functools.lru_cache(maxsize=1)
def seed_layout() -> Layout:
    return layout(seed_bytes())


# --- mutators ---------------------------------------------------------------------------------
class Mutation(NamedTuple):
    kind: str
    detail: str
    data: bytes


def _hostile_int(rng: np.random.Generator, width: int, size: int) -> int:
    """A value that breaks a size/count/offset field: 0, just past the file, 2^32, 2^63, all ones."""
    top = (1 << (8 * width)) - 1
    choices = [0, 1, size, size + 1, size * 2, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 62, 1 << 63,
               top, top - 1, int(rng.integers(0, 1 << 31)) | (int(rng.integers(1, 1 << 31)) << 32)]
    return choices[int(rng.integers(len(choices)))] & top


def _put(data: bytes, slot: Slot, v: int) -> bytes:
    b = bytearray(data)
    b[slot.offset:slot.offset + slot.width] = v.to_bytes(slot.width, "little")
    return bytes(b)


def truncate(rng, data: bytes) -> Mutation:
    # Cut the header and metadata densely, the tensor data sparsely: most damage is up front.
    lay = seed_layout()
    cut = int(rng.integers(0, lay.data_start + 64)) if rng.random() < 0.8 else int(rng.integers(0, len(data)))
    return Mutation("truncate", f"at {cut} of {len(data)}", data[:cut])


def bit_flips(rng, data: bytes) -> Mutation:
    b = bytearray(data)
    lay = seed_layout()
    n = int(rng.integers(1, 9))
    where = []
    for _ in range(n):
        end = lay.data_start if rng.random() < 0.8 else len(b)
        pos = int(rng.integers(0, end))
        b[pos] ^= 1 << int(rng.integers(0, 8))
        where.append(pos)
    return Mutation("bit_flips", f"bytes {sorted(where)}", bytes(b))


def random_bytes(rng, data: bytes) -> Mutation:
    """A run of random bytes over the metadata or tensor infos."""
    lay = seed_layout()
    pos = int(rng.integers(8, lay.data_start))
    n = int(rng.integers(1, 64))
    b = bytearray(data)
    b[pos:pos + n] = rng.integers(0, 256, size=len(b[pos:pos + n]), dtype=np.uint8).tobytes()
    return Mutation("random_bytes", f"{n} bytes at {pos}", bytes(b))


def _slot_mutator(kinds: Tuple[str, ...], name: str) -> Callable:
    def mutate(rng, data: bytes) -> Mutation:
        slots = [s for s in seed_layout().slots if s.kind in kinds]
        s = slots[int(rng.integers(len(slots)))]
        v = _hostile_int(rng, s.width, len(data))
        return Mutation(name, f"{s.kind} of {s.owner or 'header'} at {s.offset} = {v}", _put(data, s, v))
    mutate.__name__ = name
    return mutate


oversized_length = _slot_mutator(("key_len", "str_len"), "oversized_length")
oversized_count = _slot_mutator(("array_count", "n_kv", "n_tensors"), "oversized_count")
oversized_dims = _slot_mutator(("dim", "n_dims"), "oversized_dims")
oversized_offset = _slot_mutator(("tensor_offset",), "oversized_offset")


def wrong_type_code(rng, data: bytes) -> Mutation:
    """A value/array/tensor type code replaced by another valid or invalid code."""
    slots = [s for s in seed_layout().slots if s.kind in ("value_type", "array_type", "tensor_type")]
    s = slots[int(rng.integers(len(slots)))]
    v = int(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 31, 39, 40, 255, 1 << 31]))
    return Mutation("wrong_type_code", f"{s.kind} of {s.owner} = {v}", _put(data, s, v))


def misaligned_offset(rng, data: bytes) -> Mutation:
    slots = [s for s in seed_layout().slots if s.kind == "tensor_offset"]
    s = slots[int(rng.integers(len(slots)))]
    old = int.from_bytes(data[s.offset:s.offset + 8], "little")
    v = old + int(rng.integers(1, 32)) * int(rng.choice([1, -1])) if old else int(rng.integers(1, 32))
    return Mutation("misaligned_offset", f"{s.owner}: {old} -> {v}", _put(data, s, max(v, 0)))


def duplicated_key(rng, data: bytes) -> Mutation:
    """One metadata entry twice (the header's count raised to match)."""
    lay = seed_layout()
    start, end, key = lay.kv_entries[int(rng.integers(len(lay.kv_entries)))]
    n_kv = int.from_bytes(data[lay.n_kv_offset:lay.n_kv_offset + 8], "little")
    b = data[:end] + data[start:end] + data[end:]
    b = b[:lay.n_kv_offset] + (n_kv + 1).to_bytes(8, "little") + b[lay.n_kv_offset + 8:]
    return Mutation("duplicated_key", key, b)


# --- semantic mutators (rewritten with GGUFWriter) --------------------------------------------
def _junk_value(rng) -> Tuple[Any, Any, Any, str]:
    """(value, vtype, sub_type, description) of a type the loader does not expect."""
    from gguf import GGUFValueType as T

    options = [
        ("hello", T.STRING, None), ("", T.STRING, None), ("12", T.STRING, None),
        (float("nan"), T.FLOAT32, None), (float("inf"), T.FLOAT32, None), (-float("inf"), T.FLOAT64, None),
        (1e30, T.FLOAT32, None), (0.5, T.FLOAT32, None), (-1.0, T.FLOAT64, None),
        (0, T.UINT32, None), ((1 << 32) - 1, T.UINT32, None), (-1, T.INT32, None), (-(1 << 31), T.INT32, None),
        ((1 << 64) - 1, T.UINT64, None), (1 << 63, T.UINT64, None), (-(1 << 63), T.INT64, None),
        (True, T.BOOL, None), (False, T.BOOL, None), (255, T.UINT8, None), (-128, T.INT8, None),
        ([1, 2, 3], T.ARRAY, T.INT32), ([], T.ARRAY, T.INT32), (["a", "b"], T.ARRAY, T.STRING),
        ([], T.ARRAY, T.STRING), ([1.5, float("nan")], T.ARRAY, T.FLOAT32),
        ([[1, 2], [3]], T.ARRAY, T.ARRAY), ([True, False], T.ARRAY, T.BOOL),
    ]
    v, t, st = options[int(rng.integers(len(options)))]
    return v, t, st, f"{getattr(t, 'name', t)}{'[' + st.name + ']' if st is not None else ''} {v!r}"


def _emit(kind: str, detail: str, kv, tensors) -> Mutation:
    try:
        return Mutation(kind, detail, write_gguf(kv, tensors))
    except Exception as e:  # the writer refuses some combinations: keep the seed, say so
        return Mutation(kind, f"{detail} (writer refused: {type(e).__name__}; seed used)", seed_bytes())


def wrong_value_type(rng, data: bytes) -> Mutation:
    kv, tensors = seed_spec()
    i = int(rng.integers(len(kv)))
    v, t, st, desc = _junk_value(rng)
    kv[i] = KV(kv[i].key, v, t, st)
    return _emit("wrong_value_type", f"{kv[i].key} = {desc}", kv, tensors)


def missing_key(rng, data: bytes) -> Mutation:
    kv, tensors = seed_spec()
    i = int(rng.integers(len(kv)))
    key = kv.pop(i).key
    return _emit("missing_key", key, kv, tensors)


def bad_size_value(rng, data: bytes) -> Mutation:
    """A size key (layers, heads, dims, vocab, context) set to 0, negative, odd or huge."""
    from gguf import GGUFValueType as T

    kv, tensors = seed_spec()
    sizes = [i for i, e in enumerate(kv) if e.vtype == T.UINT32 and not e.key.startswith("tokenizer")]
    i = sizes[int(rng.integers(len(sizes)))]
    v, t = [(0, T.UINT32), (1, T.UINT32), (3, T.UINT32), (7, T.UINT32), (1 << 20, T.UINT32),
            ((1 << 32) - 1, T.UINT32), (-1, T.INT32), (-(1 << 31), T.INT32), (1 << 62, T.UINT64),
            ((1 << 64) - 1, T.UINT64)][int(rng.integers(10))]
    kv[i] = KV(kv[i].key, v, t)
    return _emit("bad_size_value", f"{kv[i].key} = {v}", kv, tensors)


def bad_token_ids(rng, data: bytes) -> Mutation:
    """bos/eos ids past the vocabulary, token_type/tokens/merges of the wrong length or content."""
    from gguf import GGUFValueType as T

    kv, tensors = seed_spec()
    idx = {e.key: i for i, e in enumerate(kv)}
    choice = int(rng.integers(6))
    if choice == 0:
        key, v = "tokenizer.ggml.bos_token_id", int(rng.choice([len(TOKENS), 1 << 20, (1 << 32) - 1]))
        kv[idx[key]] = KV(key, v, T.UINT32)
    elif choice == 1:
        key, v = "tokenizer.ggml.eos_token_id", int(rng.choice([len(TOKENS), 1 << 20, (1 << 32) - 1]))
        kv[idx[key]] = KV(key, v, T.UINT32)
    elif choice == 2:
        key = "tokenizer.ggml.token_type"
        v = kv[idx[key]].value[:int(rng.integers(0, len(TOKENS)))]
        kv[idx[key]] = KV(key, v, T.ARRAY, T.INT32)
    elif choice == 3:
        key = "tokenizer.ggml.merges"
        v = ["nospace", "zz qq", "a", "", " "][:int(rng.integers(1, 6))]
        kv[idx[key]] = KV(key, v, T.ARRAY, T.STRING)
    elif choice == 4:
        key = "tokenizer.ggml.tokens"
        v = TOKENS + TOKENS[:int(rng.integers(1, 5))]   # duplicated tokens
        kv[idx[key]] = KV(key, v, T.ARRAY, T.STRING)
    else:
        key = "tokenizer.chat_template"
        v = str(rng.choice(["{% for %}", "{{ messages[", "{{ 1/0 }}", "{{ ''.__class__ }}",
                            "{% for m in messages %}{{ raise_exception('x') }}{% endfor %}"]))
        kv[idx[key]] = KV(key, v, T.STRING)
    return _emit("bad_token_ids", f"{key} = {v!r:.80}", kv, tensors)


def bad_tensor(rng, data: bytes) -> Mutation:
    """A tensor missing, of the wrong shape or type, or holding NaN/inf; or an extra tensor."""
    from gguf import GGMLQuantizationType as Q

    kv, tensors = seed_spec()
    i = int(rng.integers(len(tensors)))
    t = tensors[i]
    choice = int(rng.integers(6))
    if choice == 0:
        tensors.pop(i)
        detail = f"{t.name} removed"
    elif choice == 1:
        shape = tuple(max(1, d + int(rng.choice([-1, 1]))) for d in t.array.shape)
        tensors[i] = Tensor(t.name, np.zeros(shape, np.float32), Q.F32)
        detail = f"{t.name} shape {shape}"
    elif choice == 2:
        tensors[i] = Tensor(t.name, t.array.reshape(-1), Q.F32)
        detail = f"{t.name} flattened"
    elif choice == 3:
        a = t.array.copy()
        a.flat[int(rng.integers(a.size))] = float(rng.choice([np.nan, np.inf, -np.inf]))
        tensors[i] = Tensor(t.name, a, Q.F32)
        detail = f"{t.name} has a non-finite value"
    elif choice == 4:
        tensors[i] = Tensor(t.name, t.array.T.copy(), t.qtype if t.array.ndim == 1 else Q.F32)
        detail = f"{t.name} transposed"
    else:
        tensors.append(Tensor("blk.0.attn_q.bias", np.zeros(HIDDEN + 1, np.float32), Q.F32))
        detail = "blk.0.attn_q.bias of the wrong size"
    return _emit("bad_tensor", detail, kv, tensors)


def wrong_architecture(rng, data: bytes) -> Mutation:
    kv, tensors = seed_spec()
    # qwen2 with llama's key prefix: a supported arch whose size keys are all missing.
    arch = str(rng.choice(["qwen2", "gpt2", "", "llama\x00", "LLAMA"]))
    try:
        return Mutation("wrong_architecture", arch, write_gguf(kv, tensors, arch))
    except Exception as e:
        return Mutation("wrong_architecture", f"{arch!r} (writer refused: {type(e).__name__})", seed_bytes())


MUTATORS: Dict[str, Callable[[np.random.Generator, bytes], Mutation]] = {m.__name__: m for m in (
    truncate, bit_flips, random_bytes, oversized_length, oversized_count, oversized_dims,
    oversized_offset, wrong_type_code, misaligned_offset, duplicated_key, wrong_value_type,
    missing_key, bad_size_value, bad_token_ids, bad_tensor, wrong_architecture)}


def mutate(rng: np.random.Generator, kind: Optional[str] = None) -> Mutation:
    """One hostile variant of the seed (of ``kind``, or a random kind)."""
    names = list(MUTATORS)
    kind = kind or names[int(rng.integers(len(names)))]
    return MUTATORS[kind](rng, seed_bytes())
