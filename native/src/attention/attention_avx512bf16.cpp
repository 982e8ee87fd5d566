// AVX-512 BF16 instantiation of the SIMD attention kernels: the VNNI set plus bf16 dot products,
// with which a q8 cache's prompt tiles take P x V on probabilities and values rounded to bf16
// (attention_simd.h, tile_pv_pairs). Chosen over the VNNI set wherever the CPU has both
// (attention.cpp): Zen 4, Sapphire Rapids on.
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

struct Avx512Bf16 : Avx512Vnni {
    static constexpr const char* kName = "avx512-bf16";
    static constexpr bool kBf16Values = true;
    using pvec = __m512i;  // W lanes, each two bf16: key j's (low half) and key j + 1's (high half)

    // bf16 of a's and b's lanes, rounded to nearest even, as pairs (a[i], b[i]).
    static pvec pair(vec a, vec b) {
        const __m512i low_a_high_b = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
        const __m512i interleave =
            _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
                             19, 3, 18, 2, 17, 1, 16, 0);
        return _mm512_permutexvar_epi16(interleave, low_a_high_b);
    }
    static pvec pload(const uint32_t* p) { return _mm512_loadu_si512(p); }
    static void pstore(uint32_t* p, pvec v) { _mm512_storeu_si512(p, v); }
    // acc + p.low * v.low + p.high * v.high in every lane (v: one pair broadcast).
    static vec pdot(vec acc, pvec p, uint32_t v) {
        return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(p),
                                reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(v))));
    }
};

}  // namespace
}  // namespace kernels
}  // namespace mnn_h2o

#include "attention_simd.h"

namespace mnn_h2o {
namespace kernels {

const KernelSet& avx512bf16_kernels() {
    static constexpr KernelSet set = simd::kernel_set<Avx512Bf16>();
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
