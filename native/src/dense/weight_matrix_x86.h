// Internal to weight_matrix: the x86 k-quant row kernels over 256-bit lanes, once for both ISAs
// (weight_matrix_avx2.cpp: maddubs + madd; weight_matrix_avx512vnni.cpp: vpdpbusd). 32 weights at a
// time (one activation block): the unsigned codes (Q4_K 0..15, Q6_K 0..63) times the activation's
// codes into 8 int32 lanes (lane i: bytes 4i..4i+3), then float: (lanes x scale + residual lanes x
// residual scale) x the sub-block's weight scale. Q4_K's mins and Q6_K's offset of 32 meet the
// activation's float sums once per super-block. Include only from a file compiled for AVX2.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "mnn_h2o/cache/fp16.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {
// Internal linkage: each ISA's file has its own copy, compiled with its own flags (an inline
// function shared across them could be linked to the wider one's code).
namespace {
namespace kquant_x86 {

inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float half_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
}

inline float hsum(__m256 acc) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

// codes . w and residual codes . w of one activation block, combined with its scales. Dot(w, c):
// the 8 int32 lanes of unsigned w times signed c.
template <typename Dot>
inline __m256 block_dot(__m256i w, const int8_t* c, const int8_t* rc, float s, float rs) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(w, load(c))), _mm256_set1_ps(s),
                           _mm256_mul_ps(_mm256_cvtepi32_ps(Dot::dot(w, load(rc))), _mm256_set1_ps(rs)));
}

// 8 bytes as float lanes (unsigned, or signed with Signed).
inline __m256 u8_floats(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 i8_floats(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Per super-block the eight sub-blocks' factors are formed at once (weight scale x activation
// scale, for codes and for residual codes) and the mins meet the activation's sums in a vector;
// the 32-weight steps are then two integer dots and two multiply-adds into separate accumulators.
template <typename Dot>
void q4_k_rows(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const __m256i low = _mm256_set1_epi8(15);
    const int8_t* xc = x.seq_codes.data();
    const int8_t* xr = x.seq_residual_codes.data();
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m256 acc_c = _mm256_setzero_ps(), acc_r = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
        for (int k = 0; k < p.superblocks; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 144;
            uint8_t s8[8], m8[8];
            q4_k_scales_mins(b + 4, s8, m8);
            const __m256 sv = _mm256_mul_ps(u8_floats(s8), _mm256_set1_ps(half_at(b)));
            const __m256 mv = _mm256_mul_ps(u8_floats(m8), _mm256_set1_ps(half_at(b + 2)));
            mins = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x.sums.data() + 8 * k), mins);
            alignas(32) float fc[8], fr[8];
            _mm256_store_ps(fc, _mm256_mul_ps(sv, _mm256_loadu_ps(x.scales.data() + 8 * k)));
            _mm256_store_ps(fr, _mm256_mul_ps(sv, _mm256_loadu_ps(x.residual_scales.data() + 8 * k)));
            const int8_t* c = xc + static_cast<size_t>(k) * 256;
            const int8_t* rc = xr + static_cast<size_t>(k) * 256;
            for (int g = 0; g < 4; ++g) {
                const __m256i v = load(b + 16 + 32 * g);
                const __m256i lo = _mm256_and_si256(v, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                const int j = 2 * g;
                acc_c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(lo, load(c + 32 * j))), _mm256_set1_ps(fc[j]), acc_c);
                acc_r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(lo, load(rc + 32 * j))), _mm256_set1_ps(fr[j]), acc_r);
                acc_c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(hi, load(c + 32 * j + 32))), _mm256_set1_ps(fc[j + 1]),
                                        acc_c);
                acc_r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(hi, load(rc + 32 * j + 32))), _mm256_set1_ps(fr[j + 1]),
                                        acc_r);
            }
        }
        p.y[r - r0] = hsum(_mm256_add_ps(acc_c, acc_r)) - hsum(mins);
    }
}

// Per super-block the sixteen sub-blocks' factors (d x scale x the activation block's scale, for
// codes and residual codes) are formed at once, as is the offset of 32 against the sums of 16.
template <typename Dot>
void q6_k_rows(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const __m256i low = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i first = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), second = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    const int8_t* xc = x.seq_codes.data();
    const int8_t* xr = x.seq_residual_codes.data();
    auto bits = [&](__m256i l, int lshift, __m256i hb, int hshift) {
        const __m256i lo = _mm256_and_si256(lshift ? _mm256_srli_epi16(l, 4) : l, low);
        const __m256i hi = _mm256_and_si256(hshift ? _mm256_srli_epi16(hb, hshift) : hb, two);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    };
    auto pair = [&](const float* f) {  // {f[0] x4, f[1] x4}
        return _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(f)))), lanes);
    };
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m256 acc_c = _mm256_setzero_ps(), acc_r = _mm256_setzero_ps(), offset = _mm256_setzero_ps();
        for (int k = 0; k < p.superblocks; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 210;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const __m256 d = _mm256_set1_ps(half_at(b + 208));
            const __m256 ds0 = _mm256_mul_ps(i8_floats(sc), d), ds1 = _mm256_mul_ps(i8_floats(sc + 8), d);
            offset = _mm256_fmadd_ps(ds0, _mm256_loadu_ps(x.sums16.data() + 16 * k), offset);
            offset = _mm256_fmadd_ps(ds1, _mm256_loadu_ps(x.sums16.data() + 16 * k + 8), offset);
            const __m256 xs = _mm256_loadu_ps(x.scales.data() + 8 * k);
            const __m256 xrs = _mm256_loadu_ps(x.residual_scales.data() + 8 * k);
            alignas(32) float fc[16], fr[16];
            _mm256_store_ps(fc, _mm256_mul_ps(ds0, _mm256_permutevar8x32_ps(xs, first)));
            _mm256_store_ps(fc + 8, _mm256_mul_ps(ds1, _mm256_permutevar8x32_ps(xs, second)));
            _mm256_store_ps(fr, _mm256_mul_ps(ds0, _mm256_permutevar8x32_ps(xrs, first)));
            _mm256_store_ps(fr + 8, _mm256_mul_ps(ds1, _mm256_permutevar8x32_ps(xrs, second)));
            const int8_t* c = xc + static_cast<size_t>(k) * 256;
            const int8_t* rc = xr + static_cast<size_t>(k) * 256;
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = load(b + 64 * h), l1 = load(b + 64 * h + 32), hb = load(b + 128 + 32 * h);
                const __m256i q[4] = {bits(l0, 0, hb, 0), bits(l1, 0, hb, 2), bits(l0, 4, hb, 4), bits(l1, 4, hb, 6)};
                for (int t = 0; t < 4; ++t) {
                    const int blk = 4 * h + t, s = 2 * blk;  // the activation block, its first sub-block of 16
                    acc_c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(q[t], load(c + 32 * blk))), pair(fc + s), acc_c);
                    acc_r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(q[t], load(rc + 32 * blk))), pair(fr + s), acc_r);
                }
            }
        }
        p.y[r - r0] = hsum(_mm256_add_ps(acc_c, acc_r)) - 32.f * hsum(offset);
    }
}

}  // namespace kquant_x86
}  // namespace
}  // namespace mnn_h2o
