#!/usr/bin/env bash
# Native core under sanitizers; fails on any report.
#  (a) ASan + UBSan: core, C++ tests and the Python module in $ASAN_DIR; ctest there, then the
#      Python tests that drive native code against that module (LD_PRELOAD of the ASan runtime,
#      because python itself is not instrumented; leak checking off, CPython leaks by design).
#  (b) TSan: core and C++ tests in $TSAN_DIR; the tests that run threads (thread pool, spin team,
#      the multi-threaded attention (alone, in the KV cache, under eviction, and on the decode
#      layers' team in a decode token), the C API's per-thread errors, the threaded token peaks of
#      the kvzip pass, and any worker/queue/store test, the store's parts included).
# Separate build directories from `build/`, and the instrumented module goes to
# $ASAN_DIR/python/ so the developer's mnn_h2o/_core*.so is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ASAN_DIR=${ASAN_DIR:-build-asan-rel}
TSAN_DIR=${TSAN_DIR:-build-tsan-rel}
JOBS=${JOBS:-2}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
start=$SECONDS

echo "== ASan + UBSan build ($ASAN_DIR)"
cmake -S . -B "$ASAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMNN_H2O_SANITIZE=ON \
  -DMNN_H2O_PYTHON=ON -DMNN_H2O_MODULE_DIR="$PWD/$ASAN_DIR/python" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
cmake --build "$ASAN_DIR" -j"$JOBS"

# halt_on_error makes the first report fail the test; UBSan aborts (non-zero) with a stack.
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
echo "== ASan + UBSan: ctest"
(cd "$ASAN_DIR" && ctest --output-on-failure -j"$JOBS")

echo "== ASan + UBSan: Python tests on the instrumented module"
py_tests=(tests/test_kv_cache.py tests/test_eviction.py tests/test_codec.py tests/test_codec_fuzz.py)
[ -f tests/test_lossless_stage.py ] && py_tests+=(tests/test_lossless_stage.py)
# python is not instrumented, so the ASan runtime is preloaded (it must come first in the
# process), and libstdc++ with it: otherwise ASan's __cxa_throw interceptor finds no real
# __cxa_throw at start-up and the first C++ exception (an input check) aborts the process.
preload="$(gcc -print-file-name=libasan.so) $(readlink -f "$(g++ -print-file-name=libstdc++.so)")"
# Check first that the instrumented module is the one imported (conftest honours MNN_H2O_CORE_DIR).
MNN_H2O_CORE_DIR="$ASAN_DIR/python" LD_PRELOAD="$preload" "$PY" - <<'PYEOF'
import os, sys
sys.path.insert(0, "tests")
import conftest  # noqa: F401  (applies MNN_H2O_CORE_DIR)
import mnn_h2o._core as core
want = os.path.abspath(os.environ["MNN_H2O_CORE_DIR"])
assert os.path.dirname(os.path.abspath(core.__file__)) == want, (core.__file__, want)
print("instrumented module:", core.__file__)
PYEOF
# --capture=sys: a sanitizer report is written to fd 2 and must reach the log, not pytest's capture.
MNN_H2O_CORE_DIR="$ASAN_DIR/python" LD_PRELOAD="$preload" \
  "$PY" -m pytest -q -p no:cacheprovider --capture=sys "${py_tests[@]}"

echo "== TSan build ($TSAN_DIR)"
cmake -S . -B "$TSAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMNN_H2O_TSAN=ON \
  -DMNN_H2O_PYTHON=OFF -DMNN_H2O_EXAMPLES=OFF >/dev/null
cmake --build "$TSAN_DIR" -j"$JOBS"
echo "== TSan: ctest (threaded tests)"
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
(cd "$TSAN_DIR" && ctest --output-on-failure -R 'thread|spin_team|work|queue|store|lossless|chunk|decode_cache|decode_layers|kv_cache|eviction|c_api|attention|token_peaks|reconstruction' --no-tests=error)

echo "sanitizers: clean in $((SECONDS - start)) s"
