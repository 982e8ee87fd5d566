# Cross compile for 64-bit ARM Linux with Debian's cross toolchain
# (apt-get install g++-aarch64-linux-gnu; the target's libc lives in /usr/aarch64-linux-gnu).
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DMNN_H2O_PYTHON=OFF
# or simply `cmake --preset aarch64-linux` (CMakePresets.json), which also runs the tests under
# qemu-aarch64 (Debian package qemu-user) through CMAKE_CROSSCOMPILING_EMULATOR.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(MNN_H2O_CROSS_TRIPLE aarch64-linux-gnu CACHE STRING "Prefix of the cross compiler executables")
set(CMAKE_C_COMPILER ${MNN_H2O_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${MNN_H2O_CROSS_TRIPLE}-g++)

# Look for libraries and headers in the target's sysroot only, programs on the host.
set(CMAKE_FIND_ROOT_PATH /usr/${MNN_H2O_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Run target programs (ctest, try_run) under user-mode qemu unless the caller set an emulator.
if(NOT DEFINED CMAKE_CROSSCOMPILING_EMULATOR)
  find_program(MNN_H2O_QEMU_AARCH64 qemu-aarch64)
  if(MNN_H2O_QEMU_AARCH64)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${MNN_H2O_QEMU_AARCH64} -L /usr/${MNN_H2O_CROSS_TRIPLE})
  endif()
endif()
