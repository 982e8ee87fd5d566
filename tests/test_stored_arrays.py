"""mnn_h2o.stored_arrays: the export's .npy files as byte ranges read straight into the core (the
q8 rows of a Q8_0 head here; the decode layers' npz members: tests/test_native_layers.py)."""
import numpy as np
import pytest


def test_q8_rows_from_their_files_are_the_arrays(tmp_path):
    from mnn_h2o import native, q8_0
    from mnn_h2o.stored_arrays import stored_npy

    w = np.random.default_rng(0).standard_normal((300, 96)).astype(np.float32)
    codes, scales = q8_0.quantize(w)
    np.save(tmp_path / "codes.npy", codes)
    np.save(tmp_path / "scales.npy", scales)
    c, s = stored_npy(str(tmp_path / "codes.npy"), np.int8), stored_npy(str(tmp_path / "scales.npy"), np.float16)
    assert (c.rows, c.row_bytes, s.rows, s.row_bytes) == (300, 96, 300, 6)
    from_files, from_arrays = native.Q8Matrix(c, s), native.Q8Matrix(codes, scales.view(np.uint16))
    x = np.random.default_rng(1).standard_normal((2, 96)).astype(np.float32)
    assert np.array_equal(from_files.multiply(x), from_arrays.multiply(x))
    ids = np.array([0, 17, 299])
    assert np.array_equal(from_files.rows_of(ids), from_arrays.rows_of(ids))
    with pytest.raises(ValueError, match="another shape"):
        native.Q8Matrix(c, c)  # scales of the codes' shape
    with pytest.raises(ValueError, match="not a 2-D C-ordered int8"):
        stored_npy(str(tmp_path / "scales.npy"), np.int8)
    data = (tmp_path / "codes.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:-5])
    with pytest.raises(ValueError, match="does not fill"):
        stored_npy(str(tmp_path / "cut.npy"), np.int8)
