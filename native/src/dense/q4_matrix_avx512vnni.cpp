// AVX-512 VNNI row kernel of Q4Matrix (q4_matrix_kernels.h): the AVX2 kernel's steps, with each
// nibble x code product of a block pair one vpdpbusd (32 unsigned x signed byte products summed by
// four into int32) on 256-bit lanes (AVX512-VL), and two accumulators.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 intrinsics (bug 105593)
#endif

#include <immintrin.h>

#include "../runtime/prefetch_ahead.h"
#include "q4_matrix_kernels.h"

namespace mnn_h2o {

namespace {

inline __m256i load(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

struct Pair {
    __m256i low, lanes_s, lanes_m;
    const int8_t *xc, *xr;
    const float *xs, *xrs, *xm;

    inline __m256 step(const uint8_t* q, const uint16_t* sm, int k, __m256 acc) const {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 32));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        const __m256i zero = _mm256_setzero_si256();
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(zero, lo, load(xc + k * 64)), hi, load(xc + k * 64 + 32));
        const __m256i res = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(zero, lo, load(xr + k * 64)), hi, load(xr + k * 64 + 32));
        const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + k * 4))));
        const __m256 s = _mm256_permutevar8x32_ps(f, lanes_s);
        const __m256 codes = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_loadu_ps(xs + k * 8),
                                             _mm256_mul_ps(_mm256_cvtepi32_ps(res), _mm256_loadu_ps(xrs + k * 8)));
        acc = _mm256_fmadd_ps(codes, s, acc);
        return _mm256_fmadd_ps(_mm256_permutevar8x32_ps(f, lanes_m), _mm256_loadu_ps(xm + k * 8), acc);
    }
};

}  // namespace

void q4_rows_avx512vnni(const Q4Rows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const Pair pair{_mm256_set1_epi8(15), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                    _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3), x.codes.data(), x.residual_codes.data(),
                    x.pair_scales.data(), x.pair_residual_scales.data(), x.pair_sums.data()};
    for (int r = r0; r < r1; ++r) {
        const uint8_t* q = p.nibbles + static_cast<size_t>(r) * p.pairs * 32;
        const uint16_t* sm = p.scale_mins + static_cast<size_t>(r) * p.pairs * 4;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int k = 0;
        for (; k + 1 < p.pairs; k += 2) {
            prefetch_ahead<64>(q + k * 32);
            if (k % 8 == 0) prefetch_ahead<64>(sm + k * 4);
            acc0 = pair.step(q, sm, k, acc0);
            acc1 = pair.step(q, sm, k + 1, acc1);
        }
        if (k < p.pairs) acc0 = pair.step(q, sm, k, acc0);
        const __m256 acc = _mm256_add_ps(acc0, acc1);
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        t = _mm_add_ss(t, _mm_movehdup_ps(t));
        p.y[r - r0] = _mm_cvtss_f32(t);
    }
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
