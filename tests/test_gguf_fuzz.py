"""Hostile GGUF files: each loads as a consistent model or raises ModelFileError, nothing else.

A fixed-seed run of every mutation kind of ``mnn_h2o.tools.gguf_mutations`` through the whole
load path (``fuzz_model_loader.verdict``), in this process; then one regression test per finding
the fuzzer made (each failed with another exception type, or was accepted inconsistent, before
the fix in gguf_model.py / tokenizer.py). Long runs, in a sandboxed worker process:
``python -m mnn_h2o.tools.fuzz_model_loader --iterations 20000``.
"""
import collections
import signal
import time

import numpy as np
import pytest

from mnn_h2o.errors import ModelFileError
from mnn_h2o.gguf_model import GgufModel
from mnn_h2o.tokenizer import load_tokenizer
from mnn_h2o.tools import gguf_mutations as gm
from mnn_h2o.tools.fuzz_model_loader import ACCEPTED, REJECTED, verdict

PER_KIND = 25
PER_FILE_S = 5.0


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def test_seed_model_loads(tmp_path):
    p = tmp_path / "seed.gguf"
    p.write_bytes(gm.seed_bytes())
    assert verdict(str(p)) == {"verdict": ACCEPTED}
    c = GgufModel(str(p)).config
    assert (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.vocab) == (2, 32, 4, 2, len(gm.TOKENS))


def test_layout_walk_finds_every_sizing_field():
    lay = gm.seed_layout()
    kinds = collections.Counter(s.kind for s in lay.slots)
    n_tensors = len(gm.seed_spec()[1])
    assert kinds["tensor_offset"] == kinds["n_dims"] == kinds["tensor_type"] == n_tensors
    assert kinds["array_count"] == 3  # tokens, token_type, merges
    assert len(lay.kv_entries) == len(gm.seed_spec()[0]) + 1  # + general.architecture
    assert lay.data_start % 32 == 0 and lay.data_start < len(gm.seed_bytes())


def test_fixed_seed_mutations_load_or_raise_model_file_error(tmp_path):
    rng = np.random.default_rng(20261121)
    counts = collections.Counter()
    bad = []
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.perf_counter()
    try:
        for kind in gm.MUTATORS:
            for i in range(PER_KIND):
                m = gm.mutate(rng, kind)
                p = tmp_path / f"{kind}-{i}.gguf"
                p.write_bytes(m.data)
                signal.setitimer(signal.ITIMER_REAL, PER_FILE_S)
                try:
                    v = verdict(str(p))
                except _Hang:
                    v = {"verdict": "hang", "error": f"> {PER_FILE_S} s"}
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                counts[v["verdict"]] += 1
                if v["verdict"] not in (ACCEPTED, REJECTED):
                    bad.append((kind, m.detail, v))
    finally:
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    print(f"{sum(counts.values())} files in {seconds:.1f} s: {dict(counts)}")
    assert not bad, "\n".join(f"{k}: {d} -> {v}" for k, d, v in bad[:10])
    # The run means something only if the damage is mostly caught and some variants still load.
    assert counts[REJECTED] > counts[ACCEPTED] > 0
    assert seconds < 30


# --- regression tests, one per finding --------------------------------------------------------
def _write(tmp_path, kv=None, tensors=None, name="m.gguf"):
    seed_kv, seed_tensors = gm.seed_spec()
    p = tmp_path / name
    p.write_bytes(gm.write_gguf(kv if kv is not None else seed_kv,
                                tensors if tensors is not None else seed_tensors))
    return str(p)


def _with_key(key, value, vtype, sub_type=None):
    kv, _ = gm.seed_spec()
    out = [e for e in kv if e.key != key]
    out.append(gm.KV(key, value, vtype, sub_type))
    return out


def _load_all(path):
    m = GgufModel(path)
    tok = load_tokenizer(m)
    tok.apply_chat_template("ab")
    for _ in m.layers():
        pass


def _t():
    from gguf import GGUFValueType

    return GGUFValueType


@pytest.mark.parametrize("key, value, vtype, sub, message", [
    # was TypeError: int() of a list
    ("llama.rope.dimension_count", [1.5, 2.5], "ARRAY", "FLOAT32", "must be int, got ARRAY"),
    ("llama.vocab_size", [1, 2], "ARRAY", "INT32", "must be int"),
    # was ValueError from int("hello") (a ValueError, but not ModelFileError)
    ("llama.block_count", "hello", "STRING", None, "must be int, got STRING"),
    # was TypeError: float() of a list
    ("llama.attention.layer_norm_rms_epsilon", [1.5], "ARRAY", "FLOAT32", "must be float"),
    # was OverflowError: int(-inf)
    ("tokenizer.ggml.bos_token_id", -float("inf"), "FLOAT64", None, "must be int, got FLOAT64"),
    ("llama.rope.freq_base", float("nan"), "FLOAT32", None, "is nan"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, "FLOAT32", None, "must be > 0"),
    # were ZeroDivisionError (hidden // 0) or accepted with a negative/absurd size
    ("llama.attention.head_count", 0, "UINT32", None, "out of range"),
    ("llama.block_count", -1, "INT32", None, "out of range"),
    ("llama.feed_forward_length", 1 << 62, "UINT64", None, "out of range"),
    # was IndexError in the chat template (bos id past the vocabulary)
    ("tokenizer.ggml.bos_token_id", len(gm.TOKENS), "UINT32", None, "out of range"),
    # was TypeError from list(int)
    ("tokenizer.ggml.tokens", 7, "UINT32", None, "must be str array"),
    ("tokenizer.ggml.model", [1, 2, 3], "ARRAY", "INT32", "must be str"),
])
def test_wrong_metadata_types_and_values(tmp_path, key, value, vtype, sub, message):
    T = _t()
    path = _write(tmp_path, _with_key(key, value, T[vtype], T[sub] if sub else None))
    with pytest.raises(ModelFileError, match=message) as e:
        _load_all(path)
    assert key in str(e.value) or "out of range" not in message


def test_vocab_size_disagreeing_with_the_embedding(tmp_path):
    # was accepted: vocab 2^20 with a 48-row embedding (token ids past it would index garbage)
    path = _write(tmp_path, _with_key("llama.vocab_size", 1 << 20, _t().UINT32))
    with pytest.raises(ModelFileError, match=r"token_embd.weight has shape \(48, 32\), the config says \(1048576, 32\)"):
        GgufModel(path)


def test_more_tokens_than_embedding_rows(tmp_path):
    # was accepted: the tokenizer could produce ids the embedding does not have
    T = _t()
    path = _write(tmp_path, _with_key("tokenizer.ggml.tokens", gm.TOKENS + ["xy", "zz"], T.ARRAY, T.STRING))
    with pytest.raises(ModelFileError, match="50 tokens for an embedding of 48 rows"):
        _load_all(path)


def test_token_types_of_the_wrong_length(tmp_path):
    # was silently truncated by zip(): tokens without a type were never special
    T = _t()
    path = _write(tmp_path, _with_key("tokenizer.ggml.token_type", [1] * 5, T.ARRAY, T.INT32))
    with pytest.raises(ModelFileError, match="5 token types for 48 tokens"):
        _load_all(path)


@pytest.mark.parametrize("merges, message", [
    (["nospace"], "is not two tokens"),          # was TypeError from tokenizers (PyMerges)
    (["a  b"], "is not two tokens"),
    (["ab cd", "q zz"], "tokenizer is inconsistent"),  # was Exception: merge token out of vocabulary
])
def test_bad_merges(tmp_path, merges, message):
    T = _t()
    path = _write(tmp_path, _with_key("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING))
    with pytest.raises(ModelFileError, match=message):
        _load_all(path)


@pytest.mark.parametrize("template, message", [
    ("{% for %}", "does not compile"),   # was TemplateSyntaxError, at the first generate()
    ("{{ messages[", "does not compile"),
    ("{{ 1/0 }}", "chat template failed: ZeroDivisionError"),
    ("{{ raise_exception('no') }}", "chat template failed: UndefinedError"),
])
def test_broken_chat_template(tmp_path, template, message):
    path = _write(tmp_path, _with_key("tokenizer.chat_template", template, _t().STRING))
    with pytest.raises(ModelFileError, match=message):
        _load_all(path)


def _with_tensor(name, array, qtype="F32"):
    from gguf import GGMLQuantizationType as Q

    _, tensors = gm.seed_spec()
    out = [t for t in tensors if t.name != name] + [gm.Tensor(name, array, Q[qtype])]
    return out


@pytest.mark.parametrize("name, array, message", [
    # was ValueError: cannot reshape (in _unpermute) at layer() time
    ("blk.0.attn_k.weight", np.zeros((15, 31), np.float32), r"attn_k.weight has shape \(15, 31\), the config says \(16, 32\)"),
    ("blk.0.attn_q.bias", np.zeros(33, np.float32), r"attn_q.bias has shape \(33,\), the config says \(32,\)"),
    # was accepted with a transposed matrix (the MNN export would fail or compute nonsense)
    ("blk.1.ffn_down.weight", np.zeros((64, 32), np.float32), r"ffn_down.weight has shape \(64, 32\)"),
    ("output.weight", np.zeros((47, 32), np.float32), r"output.weight has shape \(47, 32\)"),
])
def test_tensor_shapes_must_match_the_config(tmp_path, name, array, message):
    path = _write(tmp_path, tensors=_with_tensor(name, array))
    with pytest.raises(ModelFileError, match=message):
        GgufModel(path)


def _patched_slot(kind, owner, value):
    data = gm.seed_bytes()
    slot = next(s for s in gm.seed_layout().slots if s.kind == kind and s.owner == owner)
    b = bytearray(data)
    b[slot.offset:slot.offset + slot.width] = value(int.from_bytes(data[slot.offset:slot.offset + slot.width],
                                                                   "little")).to_bytes(slot.width, "little")
    return bytes(b)


def test_zero_dim_tensor_is_rejected(tmp_path):
    # was accepted: attn_output with a 0-sized dim gave a (32, 0) weight
    p = tmp_path / "zero.gguf"
    p.write_bytes(_patched_slot("dim", "blk.1.attn_output.weight", lambda v: 0))
    with pytest.raises(ModelFileError):
        GgufModel(str(p))


def test_misaligned_tensor_offset_is_rejected(tmp_path):
    # was accepted: the weights were read from shifted bytes (finite garbage)
    p = tmp_path / "misaligned.gguf"
    p.write_bytes(_patched_slot("tensor_offset", "blk.1.attn_v.weight", lambda v: v + 4))
    with pytest.raises(ModelFileError, match="blk.1.attn_v.weight data offset .* is not aligned to 32"):
        GgufModel(str(p))


@pytest.mark.parametrize("kind, owner", [("array_count", "tokenizer.ggml.tokens"),
                                         ("array_count", "tokenizer.ggml.token_type"),
                                         ("str_len", "general.name"), ("n_kv", ""), ("n_tensors", ""),
                                         ("dim", "token_embd.weight"), ("tensor_offset", "output_norm.weight")])
def test_huge_size_fields(tmp_path, kind, owner):
    for value in (1 << 63, (1 << 64) - 1, 1 << 32):
        p = tmp_path / f"{kind}.gguf"
        p.write_bytes(_patched_slot(kind, owner, lambda v: value))
        with pytest.raises(ModelFileError):
            _load_all(str(p))


@pytest.mark.parametrize("kind, owner, value", [
    # was a hang (> 20 s, found by the fuzzer): merges re-typed as an array of arrays, whose
    # counts come from string bytes; gguf.GGUFReader loops over them reading empty slices
    ("array_type", "tokenizer.ggml.merges", 9),
    # bounded before too, kept as guards of check_layout's arithmetic
    ("array_type", "tokenizer.ggml.token_type", 9),
    ("array_count", "tokenizer.ggml.token_type", 1 << 32),
    ("array_count", "tokenizer.ggml.token_type", (1 << 58) + 5),
])
def test_counts_past_the_end_fail_fast(tmp_path, kind, owner, value):
    p = tmp_path / "hang.gguf"
    p.write_bytes(_patched_slot(kind, owner, lambda v: value))
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        GgufModel(str(p))
    assert time.perf_counter() - t0 < 2.0
