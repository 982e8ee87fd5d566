// NEON row kernel of Q4Matrix (q4_matrix_kernels.h): per block, its 16 nibble bytes split into
// values 0-15 and 16-31 (0..15, so also valid int8), times the activation's codes and residual
// codes with widening multiplies (at most 2 x 15 x 127 per int16 lane), pairwise-added to int32;
// then float, times the block's scale x the activation's, plus min x the activation's sum.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "q4_matrix_kernels.h"

namespace mnn_h2o {

void q4_rows_neon(const Q4Rows& p, int r0, int r1) {
    const uint8x16_t low = vdupq_n_u8(15);
    const int8_t* xc = p.x->codes.data();
    const int8_t* xr = p.x->residual_codes.data();
    const float* xs = p.x->pair_scales.data();  // {a x4, b x4} per pair
    const float* xrs = p.x->pair_residual_scales.data();
    const float* xm = p.x->pair_sums.data();
    for (int r = r0; r < r1; ++r) {
        const uint8_t* q = p.nibbles + static_cast<size_t>(r) * p.pairs * 32;
        const uint16_t* sm = p.scale_mins + static_cast<size_t>(r) * p.pairs * 4;
        float32x4_t acc = vdupq_n_f32(0.f);
        for (int k = 0; k < p.pairs; ++k) {
            const float16x4_t h = vreinterpret_f16_u16(vld1_u16(sm + k * 4));
            const float32x4_t f = vcvt_f32_f16(h);  // scale a, scale b, min a, min b
            for (int half = 0; half < 2; ++half) {
                const uint8x16_t v = vld1q_u8(q + k * 32 + half * 16);
                const int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(v, low));
                const int8x16_t w1 = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                auto dot = [&](const int8_t* c) {
                    const int8x16_t x0 = vld1q_s8(c + k * 64 + half * 16);
                    const int8x16_t x1 = vld1q_s8(c + k * 64 + 32 + half * 16);
                    int16x8_t m = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
                    m = vmlal_s8(m, vget_high_s8(w0), vget_high_s8(x0));
                    int16x8_t n = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
                    n = vmlal_s8(n, vget_high_s8(w1), vget_high_s8(x1));
                    return vcvtq_f32_s32(vpadalq_s16(vpaddlq_s16(m), n));
                };
                const float scale = half ? vgetq_lane_f32(f, 1) : vgetq_lane_f32(f, 0);
                const float min = half ? vgetq_lane_f32(f, 3) : vgetq_lane_f32(f, 2);
                acc = vfmaq_n_f32(acc, dot(xc), scale * xs[k * 8 + half * 4]);
                acc = vfmaq_n_f32(acc, dot(xr), scale * xrs[k * 8 + half * 4]);
                acc = vfmaq_n_f32(acc, vdupq_n_f32(min), xm[k * 8 + half * 4]);
            }
        }
        p.y[r - r0] = vaddvq_f32(acc);
    }
}

}  // namespace mnn_h2o

#endif  // __aarch64__
