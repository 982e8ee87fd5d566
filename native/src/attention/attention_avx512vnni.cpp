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

namespace mnn_h2o {
namespace kernels {
namespace {

struct Avx512Vnni : Avx512 {
    static constexpr bool kInt8Scores = true;
    using ivec = __m512i;  // W int32 lanes, each the dot product of 4 byte pairs

    static ivec iload(const int8_t* p) { return _mm512_loadu_si512(p); }
    static ivec izero() { return _mm512_setzero_si512(); }
    static ivec iload32(const int32_t* p) { return _mm512_loadu_si512(p); }
    // 4 bytes broadcast to every lane.
    static ivec ibroadcast4(const uint8_t* p) {
        int32_t x;
        __builtin_memcpy(&x, p, sizeof x);
        return _mm512_set1_epi32(x);
    }
    // acc + the dot products of unsigned bytes u and signed bytes s, 4 per lane (exact: no
    // saturation in vpdpbusd).
    static ivec idot(ivec acc, ivec u, ivec s) { return _mm512_dpbusd_epi32(acc, u, s); }
    static vec to_float(ivec v) { return _mm512_cvtepi32_ps(v); }
};

}  // namespace
}  // namespace kernels
}  // namespace mnn_h2o

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
