"""Mixed-precision export (model.head_bits) and `eval weights`: variant names, export folders,
the quality measure against the exact model, and a 4-bit-layer export with an 8-bit head on
the real model."""
import json
import os

import numpy as np
import pytest

from mnn_h2o import config
from mnn_h2o.eval import weights as W
from mnn_h2o.export import WEIGHT_BITS, export_dir_for


def test_parse_variants():
    assert W.parse_variants("8,4,4/8", WEIGHT_BITS) == [(8, 8), (4, 4), (4, 8)]
    assert W.parse_variants("4/4, 8/8,4", WEIGHT_BITS) == [(4, 4), (8, 8)]  # duplicates once
    assert [W.name_of(v) for v in W.parse_variants("0,4/8", WEIGHT_BITS)] == ["0", "4/8"]
    for bad in ("", "3", "4/8/8", "x", "4/16"):
        with pytest.raises(ValueError):
            W.parse_variants(bad, WEIGHT_BITS)


def test_export_folder_names_the_head_bits_only_when_they_differ(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    same = export_dir_for(str(gguf), 4, "ab" * 32)
    assert same == export_dir_for(str(gguf), 4, "ab" * 32, head_bits=4) == export_dir_for(str(gguf), 4, "ab" * 32, -1)
    assert same.endswith("-w4-v1") or "-w4-" in os.path.basename(same)
    mixed = export_dir_for(str(gguf), 4, "ab" * 32, head_bits=8)
    assert mixed != same and "-w4h8-" in os.path.basename(mixed)


def test_head_bits_key():
    assert config.defaults()["model"]["head_bits"] == -1  # as the layers: old exports stay valid
    assert config.validate({"model": {"head_bits": 8}})["model"]["head_bits"] == 8
    with pytest.raises(config.ConfigError, match="model.head_bits"):
        config.validate({"model": {"head_bits": 2}})


def test_quality_vs_exact_drops_the_row_without_a_target():
    rng = np.random.default_rng(0)
    exact = rng.normal(size=(5, 7))
    ids = [1, 2, 3, 4, 5]
    same = W.quality_vs_exact(exact, exact.copy(), ids)
    assert same["kl"] == 0.0 and same["top1"] == 1.0
    # Only the last row differs: it predicts nothing and must not count.
    other = exact.copy()
    other[-1] = -other[-1]
    assert W.quality_vs_exact(exact, other, ids)["kl"] == 0.0
    other[0] = -other[0]
    assert W.quality_vs_exact(exact, other, ids)["kl"] > 0.0


@pytest.mark.model
def test_mixed_export_quantises_only_the_head_differently(smollm2_path, tokenizer, reference):
    """4-bit layers + 8-bit head: the layer modules are the 4-bit export's bytes, the lm_head is
    the 8-bit export's size class, and its next-token choices follow the exact model at least as
    well as the all-4-bit export (the head is where int4 loses; docs/results.md)."""
    from conftest import make_llm
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.export import export

    mixed = export(smollm2_path, weight_bits=4, head_bits=8, progress=False, modules=True)
    w4 = export(smollm2_path, weight_bits=4, progress=False, modules=True)
    with open(os.path.join(mixed, "model.json")) as f:
        meta = json.load(f)
    assert (meta["weight_bits"], meta["head_bits"]) == (4, 8)
    size = lambda d, m: os.path.getsize(os.path.join(d, m + ".mnn"))
    assert size(mixed, "layer5") == size(w4, "layer5")
    assert size(mixed, "lm_head") > 1.6 * size(w4, "lm_head")  # 8 vs 4 bits (+ scales)

    ids = essay_tokens(tokenizer, 256, offset=3000)
    exact = reference.forward(ids, all_logits=True)
    q_mixed = W.quality_vs_exact(exact, make_llm(4, head_bits=8).logits(ids), ids)
    q_w4 = W.quality_vs_exact(exact, make_llm(4).logits(ids), ids)
    assert q_mixed["kl"] < q_w4["kl"]
    assert q_mixed["top1"] >= q_w4["top1"]


def test_decode_interleave_engine_weights():
    from mnn_h2o.tools.decode_interleave import parse_engine

    cfg = config.defaults()
    assert parse_engine("f16:none", cfg)[3] == (cfg["model"]["weight_bits"], cfg["model"]["head_bits"])
    end = (cfg["runtime"]["lm_head"], cfg["runtime"]["tail"], cfg["runtime"]["decode_layers"])
    assert parse_engine("q8:h2o@6+4/8", cfg)[2:] == ("q8", (4, 8), cfg["runtime"]["memory"], end)
    assert parse_engine("f16:none+4", cfg)[3] == (4, 4)
    assert parse_engine("q8:h2o~normal", cfg)[4] == "normal"
    assert parse_engine("q8:h2o+4/8~normal", cfg)[3:] == ((4, 8), "normal", end)
    dl = cfg["runtime"]["decode_layers"]
    assert parse_engine("q8:none~normal^mnn", cfg)[4:] == ("normal", ("mnn", "mnn", dl))
    assert parse_engine("q8:none^native/mnn", cfg)[5] == ("native", "mnn", dl)
    assert parse_engine("q8:none^native/native/mnn", cfg)[5] == ("native", "native", "mnn")
    for bad in ("f16:none+3", "f16:none+w4h8", "f16:none+4/2", "f16:none+4,8", "q8:h2o~fast", "q8:none^fast",
                "q8:none^native/fast", "q8:none^native/native/fast", "q8:none^native/native/native/native"):
        with pytest.raises(SystemExit):
            parse_engine(bad, cfg)


class _Stored:
    def __init__(self, layers, head):
        self.bits = (layers, head)

    def stored_bits(self):
        return self.bits


@pytest.mark.parametrize("stored,weight_bits,head_bits,expect", [
    ((4, 8), -1, -1, (4, 8)),   # SmolLM2's file: Q4_1 layers, Q8_0 embedding
    ((8, 8), -1, -1, (8, 8)),
    ((4, 8), 8, -1, (8, 8)),
    ((4, 8), 0, -1, (0, 0)),    # a float export keeps a float head
    ((4, 8), 4, None, (4, 4)),  # the Python API's default: the head as the layers
    ((4, 8), -1, 4, (4, 4)),
])
def test_resolve_bits(stored, weight_bits, head_bits, expect):
    from mnn_h2o.export import resolve_bits

    assert resolve_bits(_Stored(*stored), weight_bits, head_bits) == expect
    with pytest.raises(ValueError, match="head_bits"):
        resolve_bits(_Stored(*stored), 8, 3)


@pytest.mark.model
def test_smollm2_file_stores_4_bit_layers_and_an_8_bit_head(smollm2_path):
    from mnn_h2o.gguf_model import GgufModel

    assert GgufModel(smollm2_path).stored_bits() == (4, 8)
