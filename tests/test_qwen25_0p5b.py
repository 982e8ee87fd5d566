"""Qwen2.5-Coder-0.5B-Instruct in Q4_K_M (the named model qwen2.5-0.5b): a file whose rows of 896
values are not whole k-quant super-blocks, so llama.cpp stored most matrices as Q5_0 (attn_v as
Q8_0 in half the layers, the output matrix Q8_0) and only ffn_down as Q4_K / Q6_K. Every type's
blocks decoded by the native core as gguf decodes them; decode and prompt in the core (0 MNN
calls) within KL 0.002 of the exact model. Slow (the first run exports the model); skipped with
the pip command where the 6 parts are not installed (scripts/test.sh --full installs them)."""
import numpy as np
import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

MODEL = "qwen2.5-0.5b"


@pytest.fixture(scope="module")
def qwen_gguf():
    from mnn_h2o.errors import ModelFileError
    from mnn_h2o.gguf_model import GgufModel
    from mnn_h2o.model_source import MODELS, resolve_gguf

    try:
        return GgufModel(resolve_gguf(MODEL))
    except ModelFileError as e:
        pytest.skip(f"{MODEL} is not installed ({MODELS[MODEL].install_hint}): {e}")


@pytest.fixture(scope="module")
def llm(qwen_gguf):
    from mnn_h2o import config
    from mnn_h2o.engine import Llm

    cfg = config.validate({"model": {"name": MODEL}, "runtime": {"kv_dtype": "f16"}, "eviction": {"enabled": False}})
    return Llm.load(MODEL, cfg, progress=False)


@pytest.fixture(scope="module")
def exact(qwen_gguf, llm):
    """The reference's log-probabilities of 256 essay tokens (float32 over the GGUF's values)."""
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.measure import log_softmax
    from mnn_h2o.reference import ReferenceModel

    ids = essay_tokens(llm.tokenizer, 256)
    ref = ReferenceModel(qwen_gguf, np.float32)
    return ids, log_softmax(ref.forward(ids, all_logits=True).astype(np.float64))


def test_every_layer_type_decodes_as_gguf_does(qwen_gguf):
    """The core's Q5_0 / Q8_0 / Q4_K / Q6_K dequantisers on the file's own bytes give gguf's values
    bit for bit (one matrix of each (matrix, type) pair, the Q8_0 output matrix's first rows)."""
    from mnn_h2o import native

    c = qwen_gguf.config
    kinds = {}
    for i in range(c.n_layers):
        for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            kinds.setdefault((m, qwen_gguf.tensors[f"blk.{i}.{m}.weight"].tensor_type.name), i)
    assert {k for _, k in kinds} == {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    for (m, kind), i in sorted(kinds.items()):
        name = f"blk.{i}.{m}.weight"
        got_kind, raw = qwen_gguf.weight_blocks(name)
        assert got_kind == kind
        assert np.array_equal(native.dequantize_blocks(kind, raw).reshape(-1), qwen_gguf.tensor(name).reshape(-1)), name
    kind, raw = qwen_gguf.weight_blocks("output.weight")
    assert kind == "Q8_0"
    assert np.array_equal(native.dequantize_blocks(kind, raw[:64]), qwen_gguf.tensor("output.weight")[:64].reshape(-1))


def _kl(exact, got):
    return np.sum(np.exp(exact) * (exact - got), axis=-1)


def test_decode_in_the_core_close_to_the_exact_model(llm, exact):
    """64 teacher-forced decode tokens after 192 prompt tokens: no MNN call a token (the layers,
    the native tail and the Q8_0 head with float activations), mean KL to the exact model at most
    0.002 (f16 KV, no eviction: the engine's arithmetic alone)."""
    from mnn_h2o.measure import log_softmax

    ids, ref = exact
    assert llm._decode_layers is not None
    llm.reset()
    rows = [llm.prefill(ids[:192])]
    calls = llm.stats.mnn_calls
    rows += [llm.decode(t) for t in ids[192:-1]]
    assert llm.stats.mnn_calls == calls, "a native decode step called MNN"
    kl = _kl(ref[191:-1], log_softmax(np.stack(rows).reshape(64, -1).astype(np.float64)))
    print(f"{MODEL}: KL to the exact model over 64 decode tokens: mean {kl.mean():.5f}, max {kl.max():.4f}")
    assert kl.mean() <= 0.002, kl.mean()


def test_prompt_in_the_core_close_to_the_exact_model(llm, exact):
    """A 192-token prompt's logits in the core (runtime.prompt_layers native: Q5_0 / Q8_0 rows on
    one rounding, Q8_0's integers split in two panels) within mean KL 0.002 of the exact model."""
    from mnn_h2o.measure import log_softmax

    ids, ref = exact
    llm.reset()
    calls = llm.stats.mnn_calls
    got = log_softmax(llm.logits(ids[:192]).astype(np.float64))
    assert llm.stats.mnn_calls == calls and llm.prompt_layers == "native"
    kl = _kl(ref[:192], got)
    print(f"{MODEL}: KL to the exact model over 192 prompt tokens: mean {kl.mean():.2e}, max {kl.max():.4f}")
    assert kl.mean() <= 0.002, kl.mean()
