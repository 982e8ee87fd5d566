// AVX2 panel kernel of the batched product (batched_product_kernels.h): a register holds four
// columns of eight panel rows (one 32-bit lane a row); maddubs multiplies them by four codes of an
// activation row broadcast to every lane (pairs of u <= 63 times |code| <= 127: at most 16002 an
// int16, no saturation) and madd with ones sums each row's four in int32. Each half of the panel
// (rows 0-7, 8-15) for M activation rows of a Q8Rows tile (2) at a time; per group (16 or 32 columns) the
// int32 dots meet the floats. AVX-512 machines without VNNI run it too.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include <immintrin.h>

#include "batched_product_kernels.h"
#include "mnn_h2o/dense/batched_product.h"

namespace mnn_h2o {

namespace {

// M activation rows of one tile (i0 % M == 0, M dividing Q8Rows::kTileRows: one pointer, constant
// offsets).
template <bool kResidual, int M, int kGroup>
void tile(const PanelTile& t, int i0) {
    const __m256i ones = _mm256_set1_epi16(1);
    const TileRow x(t, i0);
    for (int h = 0; h < 2; ++h) {
        __m256 f[M];
        for (int a = 0; a < M; ++a) f[a] = _mm256_setzero_ps();
        for (int g = 0; g < t.kc / kGroup; ++g) {
            __m256i acc[M], racc[M];
            for (int a = 0; a < M; ++a) acc[a] = racc[a] = _mm256_setzero_si256();
            for (int q = 0; q < kGroup / 4; ++q) {
                const __m256i w =
                    _mm256_load_si256(reinterpret_cast<const __m256i*>(t.u + (kGroup / 4 * g + q) * 64 + 32 * h));
                const int at = kCodeStride * (kGroup / 4 * g + q);
                for (int a = 0; a < M; ++a) {
                    const __m256i c = _mm256_set1_epi32(four_codes(x.codes + at + 4 * a));
                    acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(w, c), ones));
                    if (kResidual) {
                        const __m256i rc = _mm256_set1_epi32(four_codes(x.residual_codes + at + 4 * a));
                        racc[a] = _mm256_add_epi32(racc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(w, rc), ones));
                    }
                }
            }
            const __m256 A = _mm256_load_ps(t.a + g * kPanelRows + 8 * h), B = _mm256_load_ps(t.b + g * kPanelRows + 8 * h),
                         C = _mm256_load_ps(t.centre + g * kPanelRows + 8 * h);
            const int blk = kValueStride * (g * kGroup / 32), grp = kValueStride * g;
            for (int a = 0; a < M; ++a) {
                __m256 dots = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[a]), _mm256_set1_ps(x.steps[blk + a]));
                if (kResidual)
                    dots = _mm256_fmadd_ps(_mm256_cvtepi32_ps(racc[a]), _mm256_set1_ps(x.residual_steps[blk + a]), dots);
                f[a] = _mm256_fmadd_ps(A, dots, f[a]);
                f[a] = _mm256_fmadd_ps(B, _mm256_set1_ps(x.sums[grp + a]), f[a]);
                f[a] = _mm256_fmadd_ps(C, _mm256_set1_ps(x.errors[grp + a]), f[a]);
            }
        }
        for (int a = 0; a < M && i0 + a < t.n; ++a) {
            float* y = t.y + static_cast<size_t>(i0 + a) * t.ldy + 8 * h;
            const int w = t.width - 8 * h;  // rows of this half that exist
            if (w >= 8) {
                __m256 v = f[a];
                if (t.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y), v);
                _mm256_storeu_ps(y, v);
            } else if (w > 0) {
                alignas(32) float v[8];
                _mm256_store_ps(v, f[a]);
                for (int j = 0; j < w; ++j) y[j] = t.accumulate ? y[j] + v[j] : v[j];
            }
        }
    }
}

}  // namespace

// Two rows at a time: four measured 1.13x slower on Q4_K rows and 1.14x on Q6_K's (GCC 12 keeps
// their accumulators on the stack; bench_batched_product on the Intel VM).
void panel_tile_avx2(const PanelTile& t) {
    with_form(t, [&](auto residual, auto group) {
        for (int i = 0; i < t.n; i += 2) tile<decltype(residual)::value, 2, decltype(group)::value>(t, i);
    });
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
