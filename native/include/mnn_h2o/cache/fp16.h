// Portable scalar conversions between fp32 and the 16-bit cache types (IEEE binary16 and bfloat16).
// Both directions are bit-exact with the hardware instructions (F16C vcvtps2ph with round-to-
// nearest-even, vcvtph2ps, and the usual bf16 truncation with RNE), so a cache written by the
// scalar path and one written by a SIMD path hold the same bytes.
#pragma once

#include <cstdint>
#include <cstring>

namespace mnn_h2o {

inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) {
        // Inf stays inf; a signalling NaN comes out quiet, as vcvtph2ps does.
        return f32_from_bits(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u));
    }
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0) return f32_from_bits(sign);
    // Subnormal half: every one is a normal float. Shift the leading 1 up to bit 10.
    int e = 113;
    while (!(man & 0x400u)) {
        man <<= 1;
        --e;
    }
    return f32_from_bits(sign | (static_cast<uint32_t>(e) << 23) | ((man & 0x3FFu) << 13));
}

inline uint16_t fp32_to_fp16(float f) {
    const uint32_t u = f32_bits(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) {
        // Inf stays inf; NaN keeps its top payload bits and is made quiet, as F16C does.
        if (abs == 0x7F800000u) return sign | 0x7C00u;
        return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
    }
    if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65536: overflow to inf
    if (abs >= 0x38800000u) {
        // Normal half. Round the 13 dropped bits to nearest even; a carry out of the mantissa
        // correctly bumps the exponent.
        const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
        return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal: rounds to zero
    // Subnormal half: value = man * 2^-24 with the implicit bit made explicit.
    const uint32_t e = abs >> 23;
    const uint32_t man = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24 for e in [102, 112]
    const uint32_t half_ulp = 1u << (shift - 1);
    uint32_t result = man >> shift;
    const uint32_t rest = man & ((1u << shift) - 1);
    if (rest > half_ulp || (rest == half_ulp && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
}

inline float bf16_to_fp32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

inline uint16_t fp32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace mnn_h2o
