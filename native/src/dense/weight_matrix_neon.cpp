// NEON row kernels of WeightMatrix (weight_matrix_kernels.h): per activation block of 32,
// the unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, so also valid int8) times the activation's codes with widening multiplies (at most 2 x 63 x 127 per int16 lane), pairwise-added to
// int32 (lanes 0-1: values 0-15, lanes 2-3: values 16-31), then float per block (the activation's
// k-quant form, q4_matrix.h), as the scalar reference sums them.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>

#include "mnn_h2o/cache/fp16.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {

namespace {

inline float half_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
}

// w (values 0-15 in w0, 16-31 in w1) times c's 32 codes: lanes 0-1 sum values 0-15, 2-3 values 16-31.
inline int32x4_t dot32(int8x16_t w0, int8x16_t w1, const int8_t* c) {
    const int8x16_t c0 = vld1q_s8(c), c1 = vld1q_s8(c + 16);
    int16x8_t a = vmull_s8(vget_low_s8(w0), vget_low_s8(c0));
    a = vmlal_s8(a, vget_high_s8(w0), vget_high_s8(c0));
    int16x8_t b = vmull_s8(vget_low_s8(w1), vget_low_s8(c1));
    b = vmlal_s8(b, vget_high_s8(w1), vget_high_s8(c1));
    // pairwise: {a0+a1, .., a6+a7} (values 0-15) then b's (16-31)
    return vcombine_s32(vpadd_s32(vget_low_s32(vpaddlq_s16(a)), vget_high_s32(vpaddlq_s16(a))),
                        vpadd_s32(vget_low_s32(vpaddlq_s16(b)), vget_high_s32(vpaddlq_s16(b))));
}

// Block blk's codes against w, times its step (the super-block's step times the block's
// multiplier: the activation's k-quant form, q4_matrix.h).
inline float32x4_t block_dot(int8x16_t w0, int8x16_t w1, const Q8Activation& x, size_t blk) {
    const float32x4_t d = vcvtq_f32_s32(dot32(w0, w1, x.seq_codes.data() + blk * 32));
    return vmulq_n_f32(d, x.super_steps[blk / 8] * x.multipliers[blk]);
}

}  // namespace

// Q4_K and Q5_K: Q5_K's fifth bit (qh, weight_types.h) joins each value as 16 (values 0..31).
template <bool kFifthBit>
static void q45_k_rows(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    const Q8Activation& x = *p.x;
    const uint8x16_t low = vdupq_n_u8(15), one = vdupq_n_u8(1);
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float32x4_t acc = vdupq_n_f32(0.f);
        float mins = 0.f;
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * kBytes;
            const float d = half_at(b), dmin = half_at(b + 2);
            uint8_t s8[8], m8[8];
            q4_k_scales_mins(b + 4, s8, m8);
            const uint8x16_t qh0 = kFifthBit ? vld1q_u8(b + 16) : vdupq_n_u8(0);
            const uint8x16_t qh1 = kFifthBit ? vld1q_u8(b + 32) : vdupq_n_u8(0);
            for (int g = 0; g < 4; ++g) {
                const uint8x16_t v0 = vld1q_u8(b + kQs + 32 * g), v1 = vld1q_u8(b + kQs + 32 * g + 16);
                for (int h = 0; h < 2; ++h) {
                    const int j = 2 * g + h;
                    const int s = s8[j], m = m8[j];
                    uint8x16_t u0 = h ? vshrq_n_u8(v0, 4) : vandq_u8(v0, low);
                    uint8x16_t u1 = h ? vshrq_n_u8(v1, 4) : vandq_u8(v1, low);
                    if (kFifthBit) {
                        const int8x16_t down = vdupq_n_s8(static_cast<int8_t>(-j));
                        u0 = vorrq_u8(u0, vshlq_n_u8(vandq_u8(vshlq_u8(qh0, down), one), 4));
                        u1 = vorrq_u8(u1, vshlq_n_u8(vandq_u8(vshlq_u8(qh1, down), one), 4));
                    }
                    const size_t blk = static_cast<size_t>(8 * k + j);
                    acc = vfmaq_n_f32(acc, block_dot(vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(u1), x, blk),
                                      d * static_cast<float>(s));
                    mins += dmin * static_cast<float>(m) * x.sums[blk] -
                            d * static_cast<float>(s) * (kFifthBit ? kQ5KCentre : kQ4KCentre) * x.rounding_errors[blk];
                }
            }
        }
        p.y[r - r0] = vaddvq_f32(acc) - mins;
    }
}

void q4_k_rows_neon(const BlockRows& p, int r0, int r1) { q45_k_rows<false>(p, r0, r1); }
void q5_k_rows_neon(const BlockRows& p, int r0, int r1) { q45_k_rows<true>(p, r0, r1); }

void q6_k_rows_neon(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const uint8x16_t low = vdupq_n_u8(15), two = vdupq_n_u8(3);
    auto bits = [&](uint8x16_t l, bool high_nibble, uint8x16_t hb, int hshift) {
        const uint8x16_t lo = high_nibble ? vshrq_n_u8(l, 4) : vandq_u8(l, low);
        uint8x16_t hi;
        switch (hshift) {
            case 0: hi = vandq_u8(hb, two); break;
            case 2: hi = vandq_u8(vshrq_n_u8(hb, 2), two); break;
            case 4: hi = vandq_u8(vshrq_n_u8(hb, 4), two); break;
            default: hi = vshrq_n_u8(hb, 6); break;
        }
        return vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4)));
    };
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float32x4_t acc = vdupq_n_f32(0.f);
        float offset = 0.f;
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 210;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const float d = half_at(b + 208);
            float ds[16];
            for (int s = 0; s < 16; ++s) {
                ds[s] = d * static_cast<float>(sc[s]);
                offset += ds[s] * x.rounded_sums16[static_cast<size_t>(16 * k + s)];
            }
            for (int h = 0; h < 2; ++h) {
                const uint8_t* L = b + 64 * h;
                const uint8_t* H = b + 128 + 32 * h;
                for (int t = 0; t < 4; ++t) {
                    // values 32 t .. 32 t + 31 of this half: ql bytes L + 32 (t % 2), nibble t / 2,
                    // qh bits 2 t
                    const uint8_t* l = L + 32 * (t % 2);
                    const int8x16_t w0 = bits(vld1q_u8(l), t >= 2, vld1q_u8(H), 2 * t);
                    const int8x16_t w1 = bits(vld1q_u8(l + 16), t >= 2, vld1q_u8(H + 16), 2 * t);
                    const int s = 8 * h + 2 * t;
                    const size_t blk = static_cast<size_t>(8 * k + 4 * h + t);
                    const float32x4_t w = vcombine_f32(vdup_n_f32(ds[s]), vdup_n_f32(ds[s + 1]));
                    acc = vfmaq_f32(acc, block_dot(w0, w1, x, blk), w);
                }
            }
        }
        p.y[r - r0] = vaddvq_f32(acc) - 32.f * offset;
    }
}

// Q5_0 and Q8_0 (signed codes, one d per block of 32) on the activation's pair form: widening
// signed multiplies (at most 2 x 128 x 127 per int16 lane), pairwise-added to int32, then float
// per block.
template <bool kQ5>
static void signed_rows(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kQ5 ? 22 : 34;
    const Q8Activation& x = *p.x;
    const uint8x16_t low = vdupq_n_u8(15), sixteen = vdupq_n_u8(16);
    const uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(kBits);
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float32x4_t acc = vdupq_n_f32(0.f);
        for (int b = 0; b < p.cols / 32; ++b) {
            const uint8_t* blk = row + static_cast<size_t>(b) * kBytes;
            int8x16_t w0, w1;
            if (kQ5) {
                const uint8x16_t qs = vld1q_u8(blk + 6);
                // value i's fifth bit: bit i % 8 of qh byte i / 8
                const uint8x16_t h0 = vtstq_u8(vcombine_u8(vdup_n_u8(blk[2]), vdup_n_u8(blk[3])), bits);
                const uint8x16_t h1 = vtstq_u8(vcombine_u8(vdup_n_u8(blk[4]), vdup_n_u8(blk[5])), bits);
                w0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(qs, low), vandq_u8(h0, sixteen))),
                              vreinterpretq_s8_u8(sixteen));
                w1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(qs, 4), vandq_u8(h1, sixteen))),
                              vreinterpretq_s8_u8(sixteen));
            } else {
                w0 = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
                w1 = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
            }
            const int8_t* c = pair_codes(x, b);
            const int8x16_t c0 = vld1q_s8(c), c1 = vld1q_s8(c + 32);
            int16x8_t a = vmull_s8(vget_low_s8(w0), vget_low_s8(c0));
            a = vmlal_s8(a, vget_high_s8(w0), vget_high_s8(c0));
            int16x8_t e = vmull_s8(vget_low_s8(w1), vget_low_s8(c1));
            e = vmlal_s8(e, vget_high_s8(w1), vget_high_s8(c1));
            const int32x4_t dot = vaddq_s32(vpaddlq_s16(a), vpaddlq_s16(e));
            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(dot), half_at(blk) * x.scales[static_cast<size_t>(b)]);
        }
        p.y[r - r0] = vaddvq_f32(acc);
    }
}

void q5_0_rows_neon(const BlockRows& p, int r0, int r1) { signed_rows<true>(p, r0, r1); }
void q8_0_rows_neon(const BlockRows& p, int r0, int r1) { signed_rows<false>(p, r0, r1); }

}  // namespace mnn_h2o

#endif  // __aarch64__
