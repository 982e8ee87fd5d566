"""Missing, truncated, corrupt or foreign model files give a ModelFileError with a message."""
import numpy as np
import pytest

from mnn_h2o.errors import ModelFileError
from mnn_h2o.gguf_model import GgufModel
from mnn_h2o.model_source import resolve_gguf


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        GgufModel(str(tmp_path / "none.gguf"))


def test_unknown_model_name():
    with pytest.raises(ModelFileError, match="unknown model 'nope'"):
        resolve_gguf("nope")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        GgufModel(str(p))


def test_truncated(tmp_path, smollm2_path):
    with open(smollm2_path, "rb") as f:
        head = f.read(3_000_000)
    p = tmp_path / "trunc.gguf"
    p.write_bytes(head)
    with pytest.raises(ModelFileError):
        m = GgufModel(str(p))
        m.layer(m.config.n_layers - 1)


def test_header_bit_flips_never_crash(tmp_path, smollm2_path):
    """Flipped bytes in the metadata either still parse or raise ModelFileError; never anything
    else (the reader runs in this process, so a crash would fail the whole run)."""
    with open(smollm2_path, "rb") as f:
        head = bytearray(f.read(2_000_000))
    rng = np.random.default_rng(0)
    for trial in range(12):
        data = bytearray(head)
        for pos in rng.integers(4, 4096, size=3):
            data[pos] ^= 0xFF
        p = tmp_path / f"flip{trial}.gguf"
        p.write_bytes(bytes(data))
        try:
            GgufModel(str(p))
        except ModelFileError:
            pass


def test_unsupported_architecture(tmp_path):
    import gguf

    p = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(p, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="unsupported architecture 'gpt2'"):
        GgufModel(p)
