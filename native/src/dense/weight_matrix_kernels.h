// Internal to weight_matrix: the row kernels of the types held as GGUF blocks, each computing
// y[r - r0] for rows [r0, r1) of one segment as the scalar reference in weight_matrix.cpp does
// (layouts: weight_types.h, the products: weight_matrix.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../runtime/prefetch_ahead.h"
#include "mnn_h2o/dense/q4_matrix.h"

namespace mnn_h2o {

struct BlockRows {
    const uint8_t* blocks;  // row r at blocks + r * row_bytes
    size_t row_bytes;
    int cols;               // per row: cols / 256 super-blocks of a k-quant, cols / 32 blocks of Q5_0 / Q8_0
    const Q8Activation* x;
    float* y;
};

using BlockRowsKernel = void (*)(const BlockRows&, int r0, int r1);

// The codes' centres at which the kernels take the activation's rounding errors (q4_matrix.h):
// the middle of Q4_K's 0..15 and Q5_K's 0..31 (Q6_K's is its offset, 32).
constexpr float kQ4KCentre = 7.5f, kQ5KCentre = 15.5f;

// Q4_K's eight 6-bit scales s[j] and mins m[j] of a super-block (weight_types.h), in bytes of four 32-bit words
// (the 12 scale bytes as u0, u1, u2: s 0-3 = u0 & 63, m 0-3 = u1 & 63, s 4-7 = u2's low nibbles
// with u0's top two bits, m 4-7 = u2's high nibbles with u1's top two bits).
inline void q4_k_scales_mins(const uint8_t* sc, uint8_t s[8], uint8_t m[8]) {
    uint32_t u[3];
    std::memcpy(u, sc, 12);
    const uint32_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
    const uint32_t out[4] = {u[0] & six, (u[2] & four) | (((u[0] >> 6) & two) << 4), u[1] & six,
                             ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4)};
    std::memcpy(s, out, 8);
    std::memcpy(m, out + 2, 8);
}

// Q6_K's 256 unsigned 6-bit values of a block in order (weight_types.h): the reference
// dequantiser's and the scalar kernel's.
inline void q6_k_values(const uint8_t* b, uint8_t q[256]) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* L = b + 64 * h;
        const uint8_t* H = b + 128 + 32 * h;
        uint8_t* o = q + 128 * h;
        for (int l = 0; l < 32; ++l) {
            o[l] = static_cast<uint8_t>((L[l] & 15) | ((H[l] & 3) << 4));
            o[l + 32] = static_cast<uint8_t>((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4));
            o[l + 64] = static_cast<uint8_t>((L[l] >> 4) | (((H[l] >> 4) & 3) << 4));
            o[l + 96] = static_cast<uint8_t>((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4));
        }
    }
}

// Q5_0's 32 values of a block as signed codes n - 16 (weight_types.h).
inline void q5_0_values(const uint8_t* b, int8_t w[32]) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    for (int i = 0; i < 32; ++i) {
        const int nibble = i < 16 ? (b[6 + i] & 15) : (b[6 + i - 16] >> 4);
        w[i] = static_cast<int8_t>(nibble + 16 * static_cast<int>((qh >> i) & 1u) - 16);
    }
}

// Block b's codes in the activation's pair form (q4_matrix.h): values 0-15 here, 16-31 at + 32.
inline const int8_t* pair_codes(const Q8Activation& x, int b) {
    return x.codes.data() + 64 * static_cast<size_t>(b / 2) + 16 * (b % 2);
}

void q4_k_rows_scalar(const BlockRows& p, int r0, int r1);
void q5_k_rows_scalar(const BlockRows& p, int r0, int r1);
void q6_k_rows_scalar(const BlockRows& p, int r0, int r1);
void q5_0_rows_scalar(const BlockRows& p, int r0, int r1);
void q8_0_rows_scalar(const BlockRows& p, int r0, int r1);
#if defined(MNN_H2O_HAVE_X86_KERNELS)
void q4_k_rows_avx2(const BlockRows& p, int r0, int r1);
void q5_k_rows_avx2(const BlockRows& p, int r0, int r1);
void q6_k_rows_avx2(const BlockRows& p, int r0, int r1);
void q5_0_rows_avx2(const BlockRows& p, int r0, int r1);
void q8_0_rows_avx2(const BlockRows& p, int r0, int r1);
void q4_k_rows_avx512vnni(const BlockRows& p, int r0, int r1);
void q5_k_rows_avx512vnni(const BlockRows& p, int r0, int r1);
void q6_k_rows_avx512vnni(const BlockRows& p, int r0, int r1);
#endif
#if defined(__aarch64__)
void q4_k_rows_neon(const BlockRows& p, int r0, int r1);
void q5_k_rows_neon(const BlockRows& p, int r0, int r1);
void q6_k_rows_neon(const BlockRows& p, int r0, int r1);
void q5_0_rows_neon(const BlockRows& p, int r0, int r1);
void q8_0_rows_neon(const BlockRows& p, int r0, int r1);
#endif

}  // namespace mnn_h2o
