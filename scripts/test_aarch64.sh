#!/usr/bin/env bash
# Cross-compile the native core, its tests and the C API demo for aarch64 Linux and run them under
# qemu-aarch64 (CMake preset aarch64-linux, build directory build-aarch64). The tests check that
# the NEON kernels are the active ones and compare them with the scalar references.
#
# Needs Debian's g++-aarch64-linux-gnu and qemu-user (installed here when missing) and CMake >= 3.21.
# libzstd is not installed for arm64: under qemu the Gear codec falls back to RLE, as on any target
# without libzstd.so.1.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in g++-aarch64-linux-gnu qemu-user; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "test_aarch64: installing ${missing[*]}"
  apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi

configure() { cmake --preset aarch64-linux >/dev/null; }
# A build-aarch64 left by a different generator or toolchain cannot be reconfigured: start over.
if ! configure; then
  echo "test_aarch64: reconfiguring build-aarch64 from scratch"
  rm -rf build-aarch64
  configure
fi
cmake --build --preset aarch64-linux -j2

start=$(date +%s)
ctest --preset aarch64-linux
echo "test_aarch64: native tests under qemu-aarch64 passed in $(($(date +%s) - start)) s"
