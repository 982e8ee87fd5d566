// NEON (AArch64) row kernel of Q8Matrix (q8_matrix_kernels.h): per block, the 32 codes widened to
// float in eight lanes of 4, multiplied with x, summed, times the block's scale. Compiled on every
// platform, empty off AArch64.
#if defined(__aarch64__)

#include <arm_neon.h>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/head/q8_matrix.h"
#include "q8_matrix_kernels.h"

namespace mnn_h2o {

void q8_rows_neon(const HeadRowsProblem& p, int r0, int r1) {
    for_each_row(p, r0, r1, [](const int8_t* c, const uint16_t* s, const float* x, int nb) {
        float32x4_t acc = vdupq_n_f32(0.f);
        for (int b = 0; b < nb; ++b) {
            const int8_t* cb = c + b * kQ8Block;
            const float* xb = x + b * kQ8Block;
            float32x4_t dot = vdupq_n_f32(0.f);
            for (int h = 0; h < kQ8Block; h += 16) {
                const int8x16_t q = vld1q_s8(cb + h);
                const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
                dot = vfmaq_f32(dot, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vld1q_f32(xb + h));
                dot = vfmaq_f32(dot, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), vld1q_f32(xb + h + 4));
                dot = vfmaq_f32(dot, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vld1q_f32(xb + h + 8));
                dot = vfmaq_f32(dot, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), vld1q_f32(xb + h + 12));
            }
            acc = vfmaq_n_f32(acc, dot, fp16_to_fp32(s[b]));
        }
        return vaddvq_f32(acc);
    });
}

}  // namespace mnn_h2o

#endif  // __aarch64__
