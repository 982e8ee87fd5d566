// NEON panel kernel of the batched product (batched_product_kernels.h): 16 bytes hold four
// columns of four panel rows; u <= 63 is a signed byte too, so vmull_s8 multiplies them by four
// codes of an activation row broadcast (int16 products), a pairwise add sums each row's pairs
// (at most 2 x 63 x 127 an int16) and vpadalq the pairs into each row's int32 lane. M activation
// rows (2, of one Q8Rows tile) at a time; per group (16 or 32 columns) the int32 dots meet the floats.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "batched_product_kernels.h"
#include "mnn_h2o/dense/batched_product.h"

namespace mnn_h2o {

namespace {

inline int8x16_t four_codes_s8(const int8_t* c) { return vreinterpretq_s8_s32(vdupq_n_s32(four_codes(c))); }

template <bool kResidual, int M, int kGroup>
void tile(const PanelTile& t, int i0) {
    float32x4_t f[M][4];
    for (int a = 0; a < M; ++a)
        for (int r = 0; r < 4; ++r) f[a][r] = vdupq_n_f32(0.f);
    const TileRow x(t, i0);
    auto dot4 = [](int32x4_t acc, int8x16_t w, int8x16_t x) {
        const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        const int16x8_t hi = vmull_s8(vget_high_s8(w), vget_high_s8(x));
        return vpadalq_s16(acc, vpaddq_s16(lo, hi));
    };
    for (int g = 0; g < t.kc / kGroup; ++g) {
        int32x4_t acc[M][4], racc[M][4];
        for (int a = 0; a < M; ++a)
            for (int r = 0; r < 4; ++r) acc[a][r] = racc[a][r] = vdupq_n_s32(0);
        for (int q = 0; q < kGroup / 4; ++q) {
            const int8_t* u = reinterpret_cast<const int8_t*>(t.u + (kGroup / 4 * g + q) * 64);
            const int at = kCodeStride * (kGroup / 4 * g + q);
            for (int r = 0; r < 4; ++r) {  // rows 4 r .. 4 r + 3
                const int8x16_t w = vld1q_s8(u + 16 * r);
                for (int a = 0; a < M; ++a) {
                    acc[a][r] = dot4(acc[a][r], w, four_codes_s8(x.codes + at + 4 * a));
                    if (kResidual) racc[a][r] = dot4(racc[a][r], w, four_codes_s8(x.residual_codes + at + 4 * a));
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            const float32x4_t A = vld1q_f32(t.a + g * kPanelRows + 4 * r), B = vld1q_f32(t.b + g * kPanelRows + 4 * r),
                              C = vld1q_f32(t.centre + g * kPanelRows + 4 * r);
            const int blk = kValueStride * (g * kGroup / 32), grp = kValueStride * g;
            for (int a = 0; a < M; ++a) {
                float32x4_t dots = vmulq_n_f32(vcvtq_f32_s32(acc[a][r]), x.steps[blk + a]);
                if (kResidual) dots = vfmaq_n_f32(dots, vcvtq_f32_s32(racc[a][r]), x.residual_steps[blk + a]);
                f[a][r] = vfmaq_f32(f[a][r], A, dots);
                f[a][r] = vfmaq_n_f32(f[a][r], B, x.sums[grp + a]);
                f[a][r] = vfmaq_n_f32(f[a][r], C, x.errors[grp + a]);
            }
        }
    }
    for (int a = 0; a < M && i0 + a < t.n; ++a) {
        float* y = t.y + static_cast<size_t>(i0 + a) * t.ldy;
        float v[kPanelRows];
        for (int r = 0; r < 4; ++r) vst1q_f32(v + 4 * r, f[a][r]);
        for (int j = 0; j < t.width; ++j) y[j] = t.accumulate ? y[j] + v[j] : v[j];
    }
}

}  // namespace

void panel_tile_neon(const PanelTile& t) {
    with_form(t, [&](auto residual, auto group) {
        for (int i = 0; i < t.n; i += 2) tile<decltype(residual)::value, 2, decltype(group)::value>(t, i);
    });
}

}  // namespace mnn_h2o

#endif  // __aarch64__
