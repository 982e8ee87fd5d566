// AVX-512 row kernel of Q8Matrix (q8_matrix_kernels.h): per block, the 32 codes widened to float
// in two lanes of 16, multiplied with x, summed, times the block's scale.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which it then reports as maybe
// uninitialised wherever they are inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "mnn_h2o/head/q8_matrix.h"
#include "q8_matrix_kernels.h"

namespace mnn_h2o {

void q8_rows_avx512(const HeadRowsProblem& p, int r0, int r1) {
    for_each_row(p, r0, r1, [](const int8_t* c, const uint16_t* s, const float* x, int nb) {
        __m512 acc = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            if (b % 2 == 0) prefetch_ahead<64>(c + b * kQ8Block);
            if (b % 32 == 0) prefetch_ahead<64>(s + b);
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b * kQ8Block));
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
            __m512 dot = _mm512_mul_ps(lo, _mm512_loadu_ps(x + b * kQ8Block));
            dot = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + b * kQ8Block + 16), dot);
            acc = _mm512_fmadd_ps(dot, _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(s[b]))), acc);
        }
        return _mm512_reduce_add_ps(acc);
    });
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
