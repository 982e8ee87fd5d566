// AVX-512 (F/BW/VL, with F16C) instantiation of the SIMD attention kernels.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which it then reports as maybe
// uninitialised wherever they are inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "attention_kernels.h"

#include "attention_avx512_traits.h"
#include "attention_simd.h"

namespace mnn_h2o {
namespace kernels {

const KernelSet& avx512_kernels() {
    static constexpr KernelSet set = simd::kernel_set<Avx512>();
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
