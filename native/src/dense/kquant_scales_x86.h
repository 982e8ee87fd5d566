// Q4_K / Q5_K's packed scales and mins unpacked in a register, for the x86 row kernels
// (weight_matrix_avx2.cpp, weight_matrix_avx512vnni.cpp: both compile with AVX2). Internal
// linkage, like everything a kernel file defines, so no body built for one ISA serves another.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mnn_h2o {
namespace {

// q4_k_scales_mins (weight_matrix_kernels.h), its four 32-bit lanes computed side by side: the 12
// bytes at sc become the 8 scales (bytes 0-7) and the 8 mins (bytes 8-15). Reads 16 bytes (a
// super-block's scales are followed by its codes).
inline __m128i kquant_scales_mins(const uint8_t* sc) {
    const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
    // Lanes {u0, u2, u1, u2 >> 4} masked {six, four, six, four} bits a byte, then lanes 1 and 3
    // take the top two bits of u0's and u1's bytes as their bits 4-5.
    const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_set_epi32(4, 0, 0, 0));
    const __m128i six = _mm_set1_epi8(0x3f), four = _mm_set1_epi8(0x0f), two = _mm_set1_epi8(0x03);
    const __m128i low = _mm_and_si128(a, _mm_blend_epi32(six, four, 0b1010));
    const __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)), 6),
                                                     _mm_blend_epi32(_mm_setzero_si128(), two, 0b1010)),
                                       4);
    return _mm_or_si128(low, top);
}

// A super-block's d and dmin (its first 4 bytes, two fp16) as floats 0 and 1.
inline __m128 kquant_d_dmin(const uint8_t* b) {
    int32_t bits;
    __builtin_memcpy(&bits, b, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
}

}  // namespace
}  // namespace mnn_h2o
