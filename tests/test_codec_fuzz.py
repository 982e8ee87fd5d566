"""A short libFuzzer run of the Gear decoder and round trip, when the fuzz target is built.

Build it with clang (see the MNN_H2O_FUZZ block of CMakeLists.txt); the test looks for
``build-fuzz/fuzz_gear_codec`` or the path in ``MNN_H2O_FUZZ_BINARY`` and is skipped otherwise.
Long runs belong in CI: ``build-fuzz/fuzz_gear_codec -max_total_time=600 CORPUS``.
"""
import os
import subprocess

import numpy as np
import pytest

from mnn_h2o import codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("MNN_H2O_FUZZ_BINARY", os.path.join(ROOT, "build-fuzz", "fuzz_gear_codec"))


def write_seeds(directory: str) -> None:
    """Valid frames (first byte 0: decode mode) and arrays to round-trip (first byte 1)."""
    rng = np.random.default_rng(0)
    n = 0
    for shape in ((4, 8), (16, 4), (2, 12, 3)):
        for dtype in (np.float16, np.float32):
            a = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-2, 2, shape[-1])).astype(dtype)
            repeated = np.ascontiguousarray(np.repeat(a[..., ::2, :], 2, axis=-2))
            for arr in (a, repeated):
                for options in ({}, {"block_tokens": 3}, {"allow_zstd": False}):
                    with open(os.path.join(directory, f"frame{n:03d}"), "wb") as f:
                        f.write(b"\x00" + codec.encode(arr, **options))
                    n += 1
    for i in range(6):
        with open(os.path.join(directory, f"array{i}"), "wb") as f:
            f.write(bytes([1, i % 3, 3 + i, i, 0x7F, i % 4]) + rng.bytes(200))


@pytest.mark.skipif(not os.access(BINARY, os.X_OK), reason=f"fuzz target not built ({BINARY})")
def test_short_fuzz_run(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_seeds(str(corpus))
    r = subprocess.run([BINARY, "-runs=20000", "-max_total_time=30", "-max_len=4096",
                        f"-artifact_prefix={tmp_path}/", str(corpus)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Done" in r.stderr
