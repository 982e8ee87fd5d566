"""The architectures' layer descriptions (mnn_h2o/architecture.py) against the implementations'
tables of what they implement, matched by name: Llama and Qwen2 run everywhere, Gemma 3 in the
reference only (so far), and a layer option one implementation lacks is refused by that
implementation, naming it."""
import dataclasses

import pytest

from mnn_h2o import architecture, decoder_layer, native
from mnn_h2o.architecture import ARCHITECTURES, LayerForm, missing
from mnn_h2o.errors import ModelFileError


def test_every_table_names_the_same_options():
    options = set(LayerForm(permuted_qk=False).options(qkv_bias=False))
    assert set(decoder_layer.IMPLEMENTS) == options
    assert set(decoder_layer.BASIC) == options
    assert set(native.decode_layer_options()) == options


EVERYWHERE = ("llama", "qwen2")  # the reference, MNN's modules and the native layers


@pytest.mark.parametrize("arch", EVERYWHERE)
@pytest.mark.parametrize("bias", [False, True])
def test_llama_and_qwen2_run_in_every_implementation(smollm2_gguf, arch, bias):
    cfg = dataclasses.replace(smollm2_gguf.config, arch=arch, qkv_bias=bias)
    assert missing(cfg, decoder_layer.IMPLEMENTS) == []
    assert missing(cfg, decoder_layer.BASIC) == []
    assert missing(cfg, native.decode_layer_options()) == []


def test_gemma3_runs_in_the_reference_and_the_native_layers_only(smollm2_gguf):
    """Its layer in decoder_layer.py's halves on numpy ops and in the native layers (with the
    options that are their caller's: the engine scales the embedding, gives the window layers
    their RoPE table and the cache their windows); the MNN modules' ops lack its primitives, and
    say which (tests/test_gemma3.py: on the real file)."""
    assert set(ARCHITECTURES) == set(EVERYWHERE) | {"gemma3"}
    cfg = dataclasses.replace(smollm2_gguf.config, arch="gemma3")
    assert missing(cfg, decoder_layer.IMPLEMENTS) == []
    callers = ["embedding_scale sqrt_hidden", "global_every 6", "local_rope_base 10000.0"]
    assert missing(cfg, decoder_layer.BASIC) == ["mlp geglu", "qk_norm true", "post_norms true", "q_width heads",
                                                 *callers]
    assert missing(cfg, native.decode_layer_options()) == []


def test_an_option_not_implemented_is_refused_by_name(smollm2_gguf, monkeypatch):
    """SmolLM2 described with QK-norm: the MNN export refuses it (check_form with its ops' table);
    described with another window pattern than the engine's, the export writes no native decode
    layers and says why, and the core itself refuses the form if handed it; described with a
    LayerNorm, the reference refuses it too."""
    import numpy as np

    from mnn_h2o.export import decode_layer_arrays
    from mnn_h2o.native_layers import decode_layers_from_arrays

    arrays, why_not = decode_layer_arrays(smollm2_gguf)
    assert why_not is None
    c = smollm2_gguf.config
    qk = dataclasses.replace(ARCHITECTURES[c.arch], qk_norm=True)
    monkeypatch.setitem(architecture.ARCHITECTURES, c.arch, qk)
    with pytest.raises(ModelFileError, match="the MNN export does not implement qk_norm true"):
        decoder_layer.check_form(c, decoder_layer.BASIC, "the MNN export")
    decoder_layer.check_form(c)  # the reference has the primitive
    monkeypatch.setitem(architecture.ARCHITECTURES, c.arch, dataclasses.replace(qk, norm="layer"))
    with pytest.raises(ModelFileError, match="decoder_layer.py does not implement norm layer"):
        decoder_layer.check_form(c)
    monkeypatch.setitem(architecture.ARCHITECTURES, c.arch, qk)
    with pytest.raises(ValueError, match="q_norm and k_norm must have head_dim values"):
        decode_layers_from_arrays(arrays, c, threads=1)  # the form has QK-norm, the arrays none
    windows = dataclasses.replace(ARCHITECTURES[c.arch], qk_norm=False, global_every=4)
    monkeypatch.setitem(architecture.ARCHITECTURES, c.arch, windows)
    none, why_not = decode_layer_arrays(smollm2_gguf)
    assert none is None and why_not == (
        f"the native decode layers do not implement global_every 4 (architecture {c.arch})")
    with pytest.raises(ValueError, match="do not implement global_every 4"):
        decode_layers_from_arrays(arrays, c, threads=1)
    # Biases handed to a layer whose form has none are refused too.
    monkeypatch.setitem(architecture.ARCHITECTURES, c.arch, dataclasses.replace(qk, qk_norm=False))
    assert not c.qkv_bias
    biased = dict(arrays)
    biased["0.qkv_bias"] = np.zeros((c.n_heads + 2 * c.n_kv_heads) * c.head_dim, np.float32)
    with pytest.raises(ValueError, match="qkv_bias given where the form has none"):
        decode_layers_from_arrays(biased, c, threads=1)
