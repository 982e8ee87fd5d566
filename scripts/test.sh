#!/usr/bin/env bash
# The test suite: native tests (ctest) then the Python tests, including the real-model ones.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
(cd build && ctest --output-on-failure)
bash scripts/test_aarch64.sh
python3 -m pytest -q "$@"
