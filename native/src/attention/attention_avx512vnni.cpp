// AVX-512 VNNI instantiation of the SIMD attention kernels: the AVX-512 traits plus int8 dot
// products, with which a q8 cache's prompt tiles take Q x K^T on the int8 codes (attention_simd.h,
// tile_scores_q8). Chosen over the plain AVX-512 set wherever the CPU has VNNI (attention.cpp).
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593: attention_avx512.cpp
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "attention_kernels.h"

#include "attention_avx512_traits.h"

#include "attention_simd.h"

namespace mnn_h2o {
namespace kernels {

const KernelSet& avx512vnni_kernels() {
    static constexpr KernelSet set = simd::kernel_set<Avx512Vnni>();
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
