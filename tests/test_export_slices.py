"""The export holds little memory: gguf's decoder runs over slices of rows (GgufModel.tensor_rows),
the vocabulary-sized matrices are written slice by slice into memory-mapped files, and the decode
layers' arrays are streamed into their .npz one at a time. Each gives the arrays the whole-tensor
conversion gives (on Qwen2.5-Coder-1.5B: peak RSS 11.7 GB before, 2.4 GB after, the same files)."""
import numpy as np
import pytest

from mnn_h2o import export, q8_0
from mnn_h2o.gguf_model import GgufModel

pytestmark = pytest.mark.model


def _whole(g, name):
    import gguf

    t = g.tensors[name]
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(
        tuple(int(x) for x in reversed(t.shape)))


def test_tensor_rows_are_the_whole_tensors_rows(smollm2_gguf, monkeypatch):
    g = smollm2_gguf
    monkeypatch.setattr(GgufModel, "_DECODE_VALUES", 37 * 576 + 5)  # 37 rows a call, a short last one
    for name in ("token_embd.weight", "blk.3.ffn_down.weight"):  # Q8_0, Q4_1
        whole = _whole(g, name)
        assert np.array_equal(g.tensor(name), whole), name
        assert np.array_equal(g.tensor_rows(name, 100, 300), whole[100:300]), name
        assert g.tensor_rows(name, 5, 5).shape == (0, whole.shape[1])
    assert np.array_equal(g.tensor("output_norm.weight"), _whole(g, "output_norm.weight"))
    for start, stop in ((-1, 3), (3, 2), (0, 10 ** 6)):
        with pytest.raises(ValueError, match="rows"):
            g.tensor_rows("token_embd.weight", start, stop)
    with pytest.raises(ValueError, match="read whole"):
        g.tensor_rows("output_norm.weight", 1, 2)


def test_sliced_files_hold_the_whole_conversion(smollm2_gguf, tmp_path, monkeypatch):
    g = smollm2_gguf
    monkeypatch.setattr(export, "_ROWS_PER_SLICE", 1000)  # 49152 rows: 50 slices, the last short
    whole = g.embedding()
    export.save_f16_rows(g, "token_embd.weight", str(tmp_path / "e.npy"))
    assert np.array_equal(np.load(tmp_path / "e.npy"), whole.astype(np.float16))
    export.save_q8_rows(g, "token_embd.weight", str(tmp_path / "c.npy"), str(tmp_path / "s.npy"))
    codes, scales = q8_0.quantize(whole)
    assert np.array_equal(np.load(tmp_path / "c.npy"), codes)
    assert np.array_equal(np.load(tmp_path / "s.npy").view(np.uint16), scales.view(np.uint16))


def test_streamed_decode_layers_are_the_arrays(smollm2_gguf, tmp_path):
    """NpzWriter's file, read by np.load, holds decode_layer_entries' arrays: names, dtypes
    (the type names' strings among them) and values."""
    g = smollm2_gguf
    assert export.decode_layers_refusal(g) is None
    path = str(tmp_path / "layers.npz")
    with export.NpzWriter(path) as npz:
        for name, array in export.decode_layer_entries(g):
            npz.add(name, array)
    want, why = export.decode_layer_arrays(g)
    assert why is None
    with np.load(path) as got:
        assert sorted(got.files) == sorted(want)
        for name, array in want.items():
            assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
