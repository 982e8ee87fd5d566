// AVX2 + FMA + F16C row kernel of Q8Matrix (q8_matrix_kernels.h): per block, the 32 codes widened
// to float in four lanes of 8, multiplied with x, summed, times the block's scale.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include <immintrin.h>

#include "mnn_h2o/head/q8_matrix.h"
#include "q8_matrix_kernels.h"

namespace mnn_h2o {

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 codes8(const int8_t* c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))));
}

void q8_rows_avx2(const HeadRowsProblem& p, int r0, int r1) {
    for_each_row(p, r0, r1, [](const int8_t* c, const uint16_t* s, const float* x, int nb) {
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            if (b % 2 == 0) prefetch_ahead<64>(c + b * kQ8Block);
            if (b % 32 == 0) prefetch_ahead<64>(s + b);
            const int8_t* cb = c + b * kQ8Block;
            const float* xb = x + b * kQ8Block;
            __m256 dot = _mm256_mul_ps(codes8(cb), _mm256_loadu_ps(xb));
            dot = _mm256_fmadd_ps(codes8(cb + 8), _mm256_loadu_ps(xb + 8), dot);
            dot = _mm256_fmadd_ps(codes8(cb + 16), _mm256_loadu_ps(xb + 16), dot);
            dot = _mm256_fmadd_ps(codes8(cb + 24), _mm256_loadu_ps(xb + 24), dot);
            acc = _mm256_fmadd_ps(dot, _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(s[b]))), acc);
        }
        return hsum(acc);
    });
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
