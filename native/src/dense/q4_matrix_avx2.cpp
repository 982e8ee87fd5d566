// AVX2 row kernel of Q4Matrix (q4_matrix_kernels.h). Per block pair: one 32-byte load; its low
// nibbles times the codes of values 0-15 of both blocks and its high nibbles times those of values
// 16-31, with maddubs (at most 2 x 2 x 15 x 127 per int16: no saturation) and madd into 8 int32,
// lanes 0-3 block a's and 4-7 block b's; the same for the residual codes; then float, times the
// activation's scales, times {scale a x4, scale b x4}, plus {min a x4, min b x4} x its sums / 4.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include <immintrin.h>

#include "../runtime/prefetch_ahead.h"
#include "q4_matrix_kernels.h"

namespace mnn_h2o {

void q4_rows_avx2(const Q4Rows& p, int r0, int r1) {
    const __m256i low = _mm256_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lanes_s = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i lanes_m = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    const int8_t* xc = p.x->codes.data();
    const int8_t* xr = p.x->residual_codes.data();
    const float* xs = p.x->pair_scales.data();
    const float* xrs = p.x->pair_residual_scales.data();
    const float* xm = p.x->pair_sums.data();
    auto load = [](const int8_t* a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)); };
    for (int r = r0; r < r1; ++r) {
        const uint8_t* q = p.nibbles + static_cast<size_t>(r) * p.pairs * 32;
        const uint16_t* sm = p.scale_mins + static_cast<size_t>(r) * p.pairs * 4;
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < p.pairs; ++k) {
            if (k % 2 == 0) prefetch_ahead<64>(q + k * 32);
            if (k % 8 == 0) prefetch_ahead<64>(sm + k * 4);
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 32));
            const __m256i lo = _mm256_and_si256(v, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            const __m256i dot = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, load(xc + k * 64)), _mm256_maddubs_epi16(hi, load(xc + k * 64 + 32))),
                ones);
            const __m256i res = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, load(xr + k * 64)), _mm256_maddubs_epi16(hi, load(xr + k * 64 + 32))),
                ones);
            const __m256 f = _mm256_castps128_ps256(
                _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + k * 4))));
            const __m256 codes = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_loadu_ps(xs + k * 8),
                                                 _mm256_mul_ps(_mm256_cvtepi32_ps(res), _mm256_loadu_ps(xrs + k * 8)));
            acc = _mm256_fmadd_ps(codes, _mm256_permutevar8x32_ps(f, lanes_s), acc);
            acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(f, lanes_m), _mm256_loadu_ps(xm + k * 8), acc);
        }
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        t = _mm_add_ss(t, _mm_movehdup_ps(t));
        p.y[r - r0] = _mm_cvtss_f32(t);
    }
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
