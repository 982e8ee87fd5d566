"""The saved-session container (docs/session_format.md) without a model: a truncated, damaged,
foreign or newer file is refused with SessionFileError, whatever byte is hit."""
import struct
import zlib

import numpy as np
import pytest

from mnn_h2o import _core, session_file
from mnn_h2o.errors import SessionFileError


@pytest.fixture(scope="module")
def blob():
    """A saved-session file around the snapshot of a small evicting q8 cache."""
    cache = _core.KvCache(2, 2, 32, 4, dtype="q8", block_tokens=16, max_tokens=256, threads=1)
    cache.enable_eviction(target_keep_ratio=0.5, target_lossy_ratio=0.0, sink_tokens=16, recent_tokens=16,
                     trigger_min_tokens=32)
    rng = np.random.default_rng(0)
    out = np.empty((80, 4 * 32), np.float32)
    for layer in range(2):
        q = rng.standard_normal((80, 4 * 32), dtype=np.float32)
        k = rng.standard_normal((80, 2 * 32), dtype=np.float32)
        cache.step(layer, q, k, k.copy(), out)
    cache.end_step(80, True)
    meta = {"messages": [{"role": "user", "content": "héllo"}], "token_ids": list(range(80))}
    return meta, cache.snapshot(), session_file.encode(meta, cache.snapshot())


def test_round_trip(blob):
    meta, snapshot, data = blob
    assert session_file.decode(data) == (meta, snapshot)


def test_every_truncation_is_refused(blob):
    data = blob[2]
    step = max(1, len(data) // 3000)
    for n in list(range(0, 200)) + list(range(200, len(data), step)):
        with pytest.raises(SessionFileError, match="truncated|not a saved|damaged"):
            session_file.decode(data[:n])


def test_every_flipped_byte_is_refused(blob):
    data = bytearray(blob[2])
    step = max(1, len(data) // 3000)
    for i in list(range(0, 300)) + list(range(300, len(data), step)):
        bad = bytearray(data)
        bad[i] ^= 1 << (i % 8)
        with pytest.raises(SessionFileError):
            session_file.decode(bytes(bad))


def test_foreign_newer_and_trailing_files_are_refused(blob):
    data = blob[2]
    with pytest.raises(SessionFileError, match="not a saved mnn_h2o session"):
        session_file.decode(b"GGUF" + data[4:])
    with pytest.raises(SessionFileError, match="not a saved mnn_h2o session"):
        session_file.decode(b"")
    head = struct.pack("<8sII", session_file.MAGIC, session_file.VERSION + 1, 2)
    newer = head + struct.pack("<I", zlib.crc32(head)) + data[20:]
    with pytest.raises(SessionFileError, match="newer mnn_h2o"):
        session_file.decode(newer)
    with pytest.raises(SessionFileError, match="bytes follow the last section"):
        session_file.decode(data + b"\0")


def test_unreadable_path(tmp_path):
    with pytest.raises(SessionFileError, match="cannot read session file"):
        session_file.read(str(tmp_path / "missing.session"))


def test_snapshot_restore_binding_checks(blob):
    snapshot = blob[1]
    other = _core.KvCache(2, 2, 32, 4, dtype="f16", block_tokens=16, max_tokens=256, threads=1)
    other.enable_eviction(target_keep_ratio=0.5, target_lossy_ratio=0.0, sink_tokens=16, recent_tokens=16,
                     trigger_min_tokens=32)
    with pytest.raises(ValueError, match="dtype"):
        other.restore(snapshot)
    same = _core.KvCache(2, 2, 32, 4, dtype="q8", block_tokens=16, max_tokens=256, threads=1)
    with pytest.raises(ValueError, match="eviction on, this cache has it off"):
        same.restore(snapshot)
    same.enable_eviction(target_keep_ratio=0.5, target_lossy_ratio=0.0, sink_tokens=16, recent_tokens=16,
                    trigger_min_tokens=32)
    same.restore(snapshot)
    assert same.snapshot() == snapshot
