"""What a bench round ran on: CPU, cores, ISA, versions, commit."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


def _commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


def environment() -> dict:
    from .. import native

    return {"cpu": _cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(),
            "isa": native.best_isa(), "attention_kernels": native.attention_kernels(),
            "zstd": native.gear_zstd_available(),
            "python": sys.version.split()[0], "os": platform.platform(),
            "versions": {p: _version(p) for p in ("MNN", "numpy", "gguf", "tokenizers", "zstandard")},
            "commit": _commit()}
