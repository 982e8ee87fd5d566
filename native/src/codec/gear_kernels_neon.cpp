// NEON (AArch64) versions of the Gear codec loops that stream whole planes; see gear_kernels.h.
// Compiled on every platform, empty off AArch64. Every function gives the same bytes as its
// scalar:: reference (integer operations only); columns or elements past the last full vector
// of 16 bytes go through the same scalar expressions.
#include "gear_kernels.h"

#if defined(MNN_H2O_GEAR_NEON)

#include <arm_neon.h>

#include <cstring>

namespace mnn_h2o {
namespace gear {
namespace kernels {
namespace neon {

namespace {

inline uint8_t centre(uint8_t v, uint8_t ref, uint8_t mask, uint8_t other) {
    return static_cast<uint8_t>(((v ^ ref) & 0x80) | (((v & mask) - (ref & mask)) & mask) | (v & other));
}

inline uint8_t uncentre(uint8_t v, uint8_t ref, uint8_t mask, uint8_t other) {
    return static_cast<uint8_t>(((v ^ ref) & 0x80) | (((v & mask) + (ref & mask)) & mask) | (v & other));
}

// Rows whose exponent fields (at most 0x7F each) a 16-bit lane can sum without overflow.
constexpr size_t kSumRows = 512;

}  // namespace

void split_planes(const uint8_t* elements, size_t count, size_t es, uint8_t* const planes[]) {
    size_t i = 0;
    if (es == 2) {
        uint8_t* lo = planes[0];
        uint8_t* hi = planes[1];
        for (; i + 16 <= count; i += 16) {
            const uint8x16x2_t v = vld2q_u8(elements + 2 * i);
            vst1q_u8(lo + i, v.val[0]);
            vst1q_u8(hi + i, v.val[1]);
        }
        for (; i < count; ++i) {
            lo[i] = elements[2 * i];
            hi[i] = elements[2 * i + 1];
        }
        return;
    }
    for (; i + 16 <= count; i += 16) {
        const uint8x16x4_t v = vld4q_u8(elements + 4 * i);
        for (int k = 0; k < 4; ++k) vst1q_u8(planes[k] + i, v.val[k]);
    }
    for (; i < count; ++i)
        for (int k = 0; k < 4; ++k) planes[k][i] = elements[4 * i + k];
}

void merge_planes(const uint8_t* const planes[], size_t count, size_t es, uint8_t* elements) {
    size_t i = 0;
    if (es == 2) {
        for (; i + 16 <= count; i += 16) {
            uint8x16x2_t v;
            v.val[0] = vld1q_u8(planes[0] + i);
            v.val[1] = vld1q_u8(planes[1] + i);
            vst2q_u8(elements + 2 * i, v);
        }
        for (; i < count; ++i) {
            elements[2 * i] = planes[0][i];
            elements[2 * i + 1] = planes[1][i];
        }
        return;
    }
    for (; i + 16 <= count; i += 16) {
        uint8x16x4_t v;
        for (int k = 0; k < 4; ++k) v.val[k] = vld1q_u8(planes[k] + i);
        vst4q_u8(elements + 4 * i, v);
    }
    for (; i < count; ++i)
        for (int k = 0; k < 4; ++k) elements[4 * i + k] = planes[k][i];
}

void delta_forward(const uint8_t* P, size_t n, size_t C, bool use_xor, uint8_t* R) {
    if (n == 0) return;
    std::memcpy(R, P, C);
    for (size_t t = 1; t < n; ++t) {
        const uint8_t* row = P + t * C;
        const uint8_t* prev = row - C;
        uint8_t* out = R + t * C;
        size_t c = 0;
        if (use_xor) {
            for (; c + 16 <= C; c += 16) vst1q_u8(out + c, veorq_u8(vld1q_u8(row + c), vld1q_u8(prev + c)));
            for (; c < C; ++c) out[c] = row[c] ^ prev[c];
        } else {
            for (; c + 16 <= C; c += 16) vst1q_u8(out + c, vsubq_u8(vld1q_u8(row + c), vld1q_u8(prev + c)));
            for (; c < C; ++c) out[c] = static_cast<uint8_t>(row[c] - prev[c]);
        }
    }
}

void delta_inverse(const uint8_t* R, size_t n, size_t C, bool use_xor, uint8_t* P) {
    if (n == 0) return;
    std::memcpy(P, R, C);
    for (size_t t = 1; t < n; ++t) {
        const uint8_t* in = R + t * C;
        const uint8_t* prev = P + (t - 1) * C;
        uint8_t* row = P + t * C;
        size_t c = 0;
        if (use_xor) {
            for (; c + 16 <= C; c += 16) vst1q_u8(row + c, veorq_u8(vld1q_u8(in + c), vld1q_u8(prev + c)));
            for (; c < C; ++c) row[c] = in[c] ^ prev[c];
        } else {
            for (; c + 16 <= C; c += 16) vst1q_u8(row + c, vaddq_u8(vld1q_u8(in + c), vld1q_u8(prev + c)));
            for (; c < C; ++c) row[c] = static_cast<uint8_t>(in[c] + prev[c]);
        }
    }
}

void centre_references(const uint8_t* P, size_t n, size_t C, uint8_t mask, uint64_t* sums,
                       uint8_t* refs) {
    uint64_t* field = sums;
    uint64_t* sign = sums + C;
    for (size_t c = 0; c < 2 * C; ++c) sums[c] = 0;
    const uint8x16_t vmask = vdupq_n_u8(mask);
    size_t c0 = 0;
    // 16 channels at a time, rows in runs of kSumRows summed in 16-bit lanes.
    for (; c0 + 16 <= C; c0 += 16) {
        for (size_t t0 = 0; t0 < n; t0 += kSumRows) {
            const size_t t1 = t0 + kSumRows < n ? t0 + kSumRows : n;
            uint16x8_t f_lo = vdupq_n_u16(0), f_hi = f_lo, s_lo = f_lo, s_hi = f_lo;
            for (size_t t = t0; t < t1; ++t) {
                const uint8x16_t v = vld1q_u8(P + t * C + c0);
                const uint8x16_t f = vandq_u8(v, vmask);
                const uint8x16_t s = vshrq_n_u8(v, 7);
                f_lo = vaddw_u8(f_lo, vget_low_u8(f));
                f_hi = vaddw_high_u8(f_hi, f);
                s_lo = vaddw_u8(s_lo, vget_low_u8(s));
                s_hi = vaddw_high_u8(s_hi, s);
            }
            uint16_t fs[16], ss[16];
            vst1q_u16(fs, f_lo);
            vst1q_u16(fs + 8, f_hi);
            vst1q_u16(ss, s_lo);
            vst1q_u16(ss + 8, s_hi);
            for (int k = 0; k < 16; ++k) {
                field[c0 + k] += fs[k];
                sign[c0 + k] += ss[k];
            }
        }
    }
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* row = P + t * C;
        for (size_t c = c0; c < C; ++c) {
            field[c] += row[c] & mask;
            sign[c] += row[c] >> 7;
        }
    }
    scalar::centre_references_from_sums(sums, n, C, mask, refs);
}

size_t count_runs(const uint8_t* p, size_t n) {
    if (n == 0) return 0;
    size_t changes = 0;
    size_t i = 1;
    while (i + 16 <= n) {
        // Up to 255 vectors per 8-bit lane count, then a widening sum.
        uint8x16_t acc = vdupq_n_u8(0);
        for (int k = 0; k < 255 && i + 16 <= n; ++k, i += 16) {
            const uint8x16_t differs = vmvnq_u8(vceqq_u8(vld1q_u8(p + i), vld1q_u8(p + i - 1)));
            acc = vsubq_u8(acc, differs);  // differs is 0xFF (-1) where the bytes differ
        }
        changes += vaddlvq_u8(acc);
    }
    for (; i < n; ++i) changes += p[i] != p[i - 1];
    return 1 + changes;
}

void centre_forward(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* R) {
    const uint8_t other = static_cast<uint8_t>(~(0x80 | mask));
    const uint8x16_t vmask = vdupq_n_u8(mask), vother = vdupq_n_u8(other), vsign = vdupq_n_u8(0x80);
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* row = P + t * C;
        uint8_t* out = R + t * C;
        size_t c = 0;
        for (; c + 16 <= C; c += 16) {
            const uint8x16_t v = vld1q_u8(row + c), r = vld1q_u8(refs + c);
            const uint8x16_t s = vandq_u8(veorq_u8(v, r), vsign);
            const uint8x16_t f = vandq_u8(vsubq_u8(vandq_u8(v, vmask), vandq_u8(r, vmask)), vmask);
            vst1q_u8(out + c, vorrq_u8(vorrq_u8(s, f), vandq_u8(v, vother)));
        }
        for (; c < C; ++c) out[c] = centre(row[c], refs[c], mask, other);
    }
}

void centre_inverse(const uint8_t* R, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* P) {
    const uint8_t other = static_cast<uint8_t>(~(0x80 | mask));
    const uint8x16_t vmask = vdupq_n_u8(mask), vother = vdupq_n_u8(other), vsign = vdupq_n_u8(0x80);
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* in = R + t * C;
        uint8_t* row = P + t * C;
        size_t c = 0;
        for (; c + 16 <= C; c += 16) {
            const uint8x16_t v = vld1q_u8(in + c), r = vld1q_u8(refs + c);
            const uint8x16_t s = vandq_u8(veorq_u8(v, r), vsign);
            const uint8x16_t f = vandq_u8(vaddq_u8(vandq_u8(v, vmask), vandq_u8(r, vmask)), vmask);
            vst1q_u8(row + c, vorrq_u8(vorrq_u8(s, f), vandq_u8(v, vother)));
        }
        for (; c < C; ++c) row[c] = uncentre(in[c], refs[c], mask, other);
    }
}

}  // namespace neon
}  // namespace kernels
}  // namespace gear
}  // namespace mnn_h2o

#endif  // MNN_H2O_GEAR_NEON
