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
    """Valid frames (first byte 0: decode mode), arrays to round-trip (first byte 1) and rANS
    payloads (first byte 2: columns, symbol count, payload)."""
    from test_codec import _random_rans_tables, rans_encode

    rng = np.random.default_rng(0)
    n = 0
    for shape in ((4, 8), (16, 4), (2, 12, 3), (2, 160, 8)):
        for dtype in (np.float16, np.float32):
            a = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-2, 2, shape[-1])).astype(dtype)
            repeated = np.ascontiguousarray(np.repeat(a[..., ::2, :], 2, axis=-2))
            for arr in (a, repeated):
                for options in ({}, {"block_tokens": 3}, {"allow_zstd": False}):
                    with open(os.path.join(directory, f"frame{n:03d}"), "wb") as f:
                        f.write(b"\x00" + codec.encode(arr, **options))
                    n += 1
    for kind in ("q8", "q4"):  # quantised rows (uint8, 34 / 18 bytes per 32 values)
        rows = rng.integers(0, 256, size=(2, 24, 68 if kind == "q8" else 36), dtype=np.uint8)
        rows[:, 12:] = rows[:, :12]
        for options in ({}, {"block_tokens": 5}):
            with open(os.path.join(directory, f"frame{n:03d}"), "wb") as f:
                f.write(b"\x00" + codec.encode(rows, element_type=kind, **options))
            n += 1
    for i in range(10):  # element types 1 + i % 5: the float ones, then q8 and q4
        with open(os.path.join(directory, f"array{i}"), "wb") as f:
            f.write(bytes([1, i % 5, 3 + i, i, 0x7F, i % 4]) + rng.bytes(200))
    for i in range(8):
        columns, G, P = 1 + i % 5, 1 + i % 4 if i % 5 else 1, 6 + i
        tables = _random_rans_tables(rng, P, G, 30)
        ids = [int(rng.integers(0, G)) for _ in range(columns)] if G > 1 else None
        n = 40 + 30 * i
        data = bytes(int(rng.choice(sorted(tables[ids[j % columns] if ids else 0][2]))) for j in range(n))
        with open(os.path.join(directory, f"rans{i}"), "wb") as f:
            f.write(bytes([2, columns - 1, n & 0xFF, n >> 8]) + rans_encode(data, columns, P, tables, ids))


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
