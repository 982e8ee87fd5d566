"""The export cache's check: a cached export is found without opening its GGUF (the file's digest
and stored bits remembered under its identity, mnn_h2o/export.py known_source), and a file that
changed, or a record that cannot be read, sends the check back to the file."""
import os

import pytest

from mnn_h2o import export


def test_a_cached_export_is_found_without_opening_the_gguf(monkeypatch):
    from mnn_h2o.config import defaults

    model = defaults()["model"]
    first = export.ensure_exported(model, progress=False)  # remembers the file if it was not yet
    monkeypatch.setattr(export, "GgufModel", lambda path: pytest.fail("the GGUF was opened"))
    monkeypatch.setattr(export, "file_digest", lambda path: pytest.fail("the GGUF was hashed"))
    assert export.ensure_exported(model, progress=False) == first


def test_a_changed_file_or_an_unreadable_record_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MNN_H2O_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + bytes(60))
    assert export.known_source(str(src)) is None
    export.remember_source(str(src), "ab" * 32, (4, 8))
    known = export.known_source(str(src))
    assert known.sha256 == "ab" * 32 and known.stored_bits() == (4, 8)
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert export.known_source(str(src)) is None  # rewritten: its mtime moved
    export.remember_source(str(src), "cd" * 32, (8, 8))
    assert export.known_source(str(src)).sha256 == "cd" * 32
    (tmp_path / "cache" / export.SOURCES_FILE).write_text("{not json")
    assert export.known_source(str(src)) is None
    (tmp_path / "cache" / export.SOURCES_FILE).write_text('{"%s": {"size": "x"}}' % os.path.realpath(src))
    assert export.known_source(str(src)) is None
    monkeypatch.setenv("MNN_H2O_CACHE", str(src))  # a file where the cache folder should be
    export.remember_source(str(src), "ef" * 32, (8, 8))  # best effort: no error
    assert export.known_source(str(src)) is None
