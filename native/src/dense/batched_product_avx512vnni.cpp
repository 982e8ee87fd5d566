// AVX-512 VNNI panel kernel of the batched product (batched_product_kernels.h): a register holds
// four columns of the panel's 16 rows (one 32-bit lane a row), and vpdpbusd multiplies them by
// four codes of an activation row broadcast to every lane: 64 multiply-adds an instruction, the
// unsigned u (<= 63) times the signed codes summed in int32 lanes without saturation. M
// activation rows (a tile of Q8Rows, 8) at a time; per group (16 or 32 columns) the int32 dots meet the floats.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
// GCC 12 warns of an uninitialised variable inside its own _mm512_cvtepi32_ps (its header passes
// an undefined vector as the unused merge source).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "batched_product_kernels.h"
#include "mnn_h2o/dense/batched_product.h"

namespace mnn_h2o {

namespace {

// The M = Q8Rows::kTileRows rows of one activation tile (from one pointer at constant offsets).
template <bool kResidual, int kGroup>
void tile(const PanelTile& t, int i0) {
    constexpr int M = Q8Rows::kTileRows;
    const TileRow x(t, i0);
    __m512 f[M];
    for (int a = 0; a < M; ++a) f[a] = _mm512_setzero_ps();
    for (int g = 0; g < t.kc / kGroup; ++g) {
        __m512i acc[M], racc[M];
        for (int a = 0; a < M; ++a) acc[a] = racc[a] = _mm512_setzero_si512();
        for (int q = 0; q < kGroup / 4; ++q) {
            const __m512i w = _mm512_load_si512(t.u + (kGroup / 4 * g + q) * 64);
            const int at = kCodeStride * (kGroup / 4 * g + q);
            for (int a = 0; a < M; ++a) {
                acc[a] = _mm512_dpbusd_epi32(acc[a], w, _mm512_set1_epi32(four_codes(x.codes + at + 4 * a)));
                if (kResidual)
                    racc[a] = _mm512_dpbusd_epi32(racc[a], w, _mm512_set1_epi32(four_codes(x.residual_codes + at + 4 * a)));
            }
        }
        const __m512 A = _mm512_load_ps(t.a + g * kPanelRows), B = _mm512_load_ps(t.b + g * kPanelRows),
                     C = _mm512_load_ps(t.centre + g * kPanelRows);
        const int blk = kValueStride * (g * kGroup / 32), grp = kValueStride * g;
        for (int a = 0; a < M; ++a) {
            __m512 dots = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[a]), _mm512_set1_ps(x.steps[blk + a]));
            if (kResidual)
                dots = _mm512_fmadd_ps(_mm512_cvtepi32_ps(racc[a]), _mm512_set1_ps(x.residual_steps[blk + a]), dots);
            f[a] = _mm512_fmadd_ps(A, dots, f[a]);
            f[a] = _mm512_fmadd_ps(B, _mm512_set1_ps(x.sums[grp + a]), f[a]);
            f[a] = _mm512_fmadd_ps(C, _mm512_set1_ps(x.errors[grp + a]), f[a]);
        }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << t.width) - 1u);
    for (int a = 0; a < M && i0 + a < t.n; ++a) {
        float* y = t.y + static_cast<size_t>(i0 + a) * t.ldy;
        __m512 v = f[a];
        if (t.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
        _mm512_mask_storeu_ps(y, mask, v);
    }
}

}  // namespace

void panel_tile_avx512vnni(const PanelTile& t) {
    with_form(t, [&](auto residual, auto group) {
        for (int i = 0; i < t.n; i += Q8Rows::kTileRows) tile<decltype(residual)::value, decltype(group)::value>(t, i);
    });
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
