#!/usr/bin/env bash
# The test suite: native tests (ctest) then the Python tests, including the real-model ones.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
(cd build && ctest --output-on-failure)
bash scripts/test_aarch64.sh
# ASan+UBSan (C++ tests and the Python tests of the native module) and TSan (threaded tests),
# in their own build directories; 5.5 minutes on 2 cores from scratch (most of it
# test_attention and test_kv_store under TSan), less when incremental.
bash scripts/test_sanitizers.sh
python3 -m pytest -q "$@"
