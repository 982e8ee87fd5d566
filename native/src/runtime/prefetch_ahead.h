// Internal to the row kernels (dense/, head/): software prefetch of a row stream's weights.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnn_h2o {

// How far ahead of the bytes being read a row kernel asks for the next. A decode token reads every
// matrix once, from DRAM, in one stream per thread; the hardware prefetchers of the VMs measured
// here did not keep that stream fed: on the Intel VM a Q4_K product from DRAM ran at 4.5 GB/s on
// one thread without software prefetch and 11.0 with it 1 KiB ahead (512 B: 9.0, 2 KiB: 11.0,
// 4 KiB: 8.6; build/bench_row_kernels, docs/notebook/row_kernel_prefetch.md).
constexpr size_t kPrefetchBytes = 1024;

// The cache lines of the kBytes at p + kPrefetchBytes. The address is formed as an integer: past
// a matrix's end it names memory no object owns, which a prefetch may do (it never faults or reads).
template <int kBytes>
inline void prefetch_ahead(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kPrefetchBytes;
    for (int o = 0; o < kBytes; o += 64) __builtin_prefetch(reinterpret_cast<const void*>(a + static_cast<uintptr_t>(o)));
}

}  // namespace mnn_h2o
