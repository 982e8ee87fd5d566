// NEON (AArch64) instantiation of the SIMD attention kernels. Compiled on every platform, empty
// off AArch64.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "attention_kernels.h"

namespace mnn_h2o {
namespace kernels {
namespace {

struct Neon {
    static constexpr const char* kName = "neon";
    using vec = float32x4_t;
    static constexpr int W = 4;
    static constexpr int kDecodeRows = 4;  // 16 accumulators of 32 registers
    static constexpr int kTileKeys = 8;    // 16 accumulators (8 keys x 2 row vectors)
    static constexpr int kPvCols = 8;      // 16 accumulators (8 value columns x 2 row vectors)
    static constexpr bool kInt8Scores = false;
    static constexpr bool kBf16Values = false;

    static vec zero() { return vdupq_n_f32(0.f); }
    static vec set1(float x) { return vdupq_n_f32(x); }
    static vec load(const float* p) { return vld1q_f32(p); }
    static void store(float* p, vec v) { vst1q_f32(p, v); }
    static vec add(vec a, vec b) { return vaddq_f32(a, b); }
    static vec sub(vec a, vec b) { return vsubq_f32(a, b); }
    static vec mul(vec a, vec b) { return vmulq_f32(a, b); }
    static vec fmadd(vec a, vec b, vec c) { return vfmaq_f32(c, a, b); }
    static vec max(vec a, vec b) { return vmaxq_f32(a, b); }
    static float hsum(vec v) { return vaddvq_f32(v); }
    static float hmax(vec v) { return vmaxvq_f32(v); }
    static void reduce4(vec a, vec b, vec c, vec d, float* out) {
        vst1q_f32(out, vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d)));
    }
    static vec round(vec v) { return vrndnq_f32(v); }
    static vec pow2n(vec n) {
        return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23));
    }
    static vec select_lt(vec a, vec b, vec x, vec y) { return vbslq_f32(vcltq_f32(a, b), x, y); }
    // s holds each lane's partner x[i ^ L]; the select takes s - x where i & L is set.
    template <int L>
    static vec butterfly(vec x) {
        static constexpr uint32_t kHigh[4] = {0, L == 1 ? ~0u : 0, L == 1 ? 0 : ~0u, ~0u};
        const vec s = L == 1 ? vrev64q_f32(x) : vextq_f32(x, x, 2);
        return vbslq_f32(vld1q_u32(kHigh), vsubq_f32(s, x), vaddq_f32(x, s));
    }

    static vec load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
    static vec load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
    static void store_f16(uint16_t* p, vec v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
    static void store_bf16(uint16_t* p, vec v) {
        const uint32x4_t u = vreinterpretq_u32_f32(v);
        const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
        const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7FFF)), lsb), 16);
        const uint32x4_t nan = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
        const uint32x4_t is_num = vceqq_f32(v, v);
        vst1_u16(p, vmovn_u32(vbslq_u32(is_num, rounded, nan)));
    }

    static vec load_i8(const int8_t* p) {
        uint32_t bytes;
        __builtin_memcpy(&bytes, p, sizeof bytes);
        const int16x8_t w = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(bytes)));
        return vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
    }
    static vec load_u4(const uint8_t* p) {
        uint16_t bytes;
        __builtin_memcpy(&bytes, p, sizeof bytes);
        const uint8x8_t x = vreinterpret_u8_u16(vdup_n_u16(bytes));
        const uint8x8_t codes = vzip1_u8(vand_u8(x, vdup_n_u8(0x0F)), vshr_n_u8(x, 4));
        return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(codes))));
    }
    static float half(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
};

}  // namespace
}  // namespace kernels
}  // namespace mnn_h2o

#include "attention_simd.h"

namespace mnn_h2o {
namespace kernels {

const KernelSet& neon_kernels() {
    static constexpr KernelSet set = simd::kernel_set<Neon>();
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o

#endif  // __aarch64__
