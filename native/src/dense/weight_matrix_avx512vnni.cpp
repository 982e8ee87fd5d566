// AVX-512 VNNI row kernels of WeightMatrix's k-quants (weight_matrix_kernels.h), on the
// activation's k-quant form (q4_matrix.h). The AVX2 kernels' arithmetic on 512-bit registers: a
// register holds two sub-blocks, maddubs forms the unsigned code x activation code pairs in int16
// (the AVX2 kernels' bounds), and VNNI's vpdpwssd multiplies them by the sub-blocks' int16
// multipliers and adds into int32 in one instruction where AVX2 needs madd and add. What makes
// the AVX2 kernels compute bound on Intel cores (two AVX2 ops for every pair of values that
// vpdpwssd does in one, on half the width) is what this removes; the floats are the same ones.
//
// A super-block's sub-blocks land in register halves without shuffling the activation: Q4_K /
// Q5_K's 32 bytes of a sub-block pair are broadcast to both halves and shifted by 0 or 4 bits per
// half (the low nibbles are sub-block 2g, the high 2g + 1), Q6_K's 64 low-bit bytes are already
// 64 values in order. Each half's multiplier is picked from one register with vpermw.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 intrinsics (bug 105593)
#endif

#include <immintrin.h>

#include <cstring>

#include "kquant_scales_x86.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {

namespace {

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i both_halves(const uint8_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline float half_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

// vpermw indices: int16 lanes 0-15 take word `lo`, lanes 16-31 word `hi`, of the multipliers.
inline __m512i halves_pick(int lo, int hi) {
    return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(static_cast<short>(lo)),
                                   _mm512_set1_epi16(static_cast<short>(hi)));
}
// vpermw indices for Q6_K's sub-blocks of 16: lanes 8 i .. 8 i + 7 take word 4 q + i.
inline __m512i quarters_pick(int q) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                          11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_add_epi16(_mm512_srli_epi16(lane, 3), _mm512_set1_epi16(static_cast<short>(4 * q)));
}

// Per 64-bit lane shift counts: `lo` for the lower 256 bits, `hi` for the upper.
inline __m512i halves_count(int lo, int hi) {
    return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);
}

}  // namespace

// Q4_K and Q5_K. Per sub-block pair g (32 bytes of qs): both halves of a register hold the bytes,
// shifted right by 0 / 4 and masked to the nibbles of sub-blocks 2g / 2g + 1; Q5_K's fifth bits
// of those sub-blocks are bits 2g / 2g + 1 of qh's bytes, shifted down the same way. The int32
// lanes: at most 4 x 2 x 7874 x 8064 < 2^31 per super-block before they meet its float factor.
// The float terms of the 8 mins (against the block sums) and of the errors at the centre (8
// scales against the rounding errors) are one 16-lane product a super-block, into the same
// accumulator as the dots.
template <bool kFifthBit>
static void q45_k_rows(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    constexpr float kCentre = kFifthBit ? kQ5KCentre : kQ4KCentre;
    const Q8Activation& x = *p.x;
    const __m512i low = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1), nibble_shift = halves_count(0, 4);
    const __m512i pick[4] = {halves_pick(0, 1), halves_pick(2, 3), halves_pick(4, 5), halves_pick(6, 7)};
    __m512i bit_shift[4];
    for (int g = 0; g < 4; ++g) bit_shift[g] = halves_count(2 * g, 2 * g + 1);
    // d * kCentre for the scales' lanes, -dmin for the mins'.
    const __m128 signs = _mm_set_ps(0.f, 0.f, -1.f, kCentre);
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m512 acc = _mm512_setzero_ps();
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * kBytes;
            prefetch_ahead<kBytes>(b);
            const __m128i sm = kquant_scales_mins(b + 4);
            const __m128 dd = kquant_d_dmin(b);
            const __m512 factor = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dd, signs)));
            const __m512 errors_sums = _mm512_castpd_ps(
                _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_loadu_pd(reinterpret_cast<const double*>(x.rounding_errors.data() + 8 * k))),
                                   _mm256_loadu_pd(reinterpret_cast<const double*>(x.sums.data() + 8 * k)), 1));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm)), factor), errors_sums, acc);
            const __m512i mc = _mm512_broadcast_i32x4(_mm_mullo_epi16(
                _mm_cvtepu8_epi16(sm), _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.multipliers.data() + 8 * k))));
            const int8_t* c = x.seq_codes.data() + static_cast<size_t>(k) * 256;
            const __m512i qh = kFifthBit ? both_halves(b + 16) : _mm512_setzero_si512();
            __m512i ic = _mm512_setzero_si512();
            for (int g = 0; g < 4; ++g) {
                __m512i w = _mm512_and_si512(_mm512_srlv_epi64(both_halves(b + kQs + 32 * g), nibble_shift), low);
                if (kFifthBit)
                    w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, bit_shift[g]), one), 4));
                const __m512i pairs = _mm512_maddubs_epi16(w, load512(c + 64 * g));
                ic = _mm512_dpwssd_epi32(ic, pairs, _mm512_permutexvar_epi16(pick[g], mc));
            }
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ic), _mm512_set1_ps(_mm_cvtss_f32(dd) * x.super_steps[static_cast<size_t>(k)]), acc);
        }
        p.y[r - r0] = _mm512_reduce_add_ps(acc);
    }
}

void q4_k_rows_avx512vnni(const BlockRows& p, int r0, int r1) { q45_k_rows<false>(p, r0, r1); }
void q5_k_rows_avx512vnni(const BlockRows& p, int r0, int r1) { q45_k_rows<true>(p, r0, r1); }

// Q6_K. Per half h of a super-block: ql's 64 bytes are values 128 h + 0..63 in their low nibbles
// and + 64..127 in their high ones; qh's 32 bytes (in both register halves) give each its top two
// bits, shifted into bits 4-5 per 64-bit lane (the mask keeps a byte's own bits). Sixteen
// sub-blocks of 16, each with its scale times its block's multiplier as an int16; the int32 lanes
// meet the floats once per half (2 x 2 x 16002 x 16384 < 2^31), the offset of 32 the rounded sums.
void q6_k_rows_avx512vnni(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    const __m512i left = halves_count(4, 2), right = halves_count(0, 2);
    const __m512i pick[4] = {quarters_pick(0), quarters_pick(1), quarters_pick(2), quarters_pick(3)};
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m512 acc = _mm512_setzero_ps(), offset = _mm512_setzero_ps();
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 210;
            prefetch_ahead<210>(b);
            const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
            const float d = half_at(b + 208);
            const __m512 scd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), _mm512_set1_ps(d));
            offset = _mm512_fmadd_ps(scd, _mm512_loadu_ps(x.rounded_sums16.data() + 16 * k), offset);
            // Sub-block j's multiplier: its scale times its block's (j / 2) multiplier.
            const __m128i m8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.multipliers.data() + 8 * k));
            const __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
            const __m512i mc = _mm512_zextsi256_si512(_mm256_mullo_epi16(_mm256_cvtepi8_epi16(sc), m16));
            const int8_t* c = x.seq_codes.data() + static_cast<size_t>(k) * 256;
            __m512 fc = _mm512_setzero_ps();
            for (int h = 0; h < 2; ++h) {
                const __m512i l = load512(b + 64 * h), hb = both_halves(b + 128 + 32 * h);
                const __m512i lo = _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(_mm512_sllv_epi64(hb, left), top));
                const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low),
                                                   _mm512_and_si512(_mm512_srlv_epi64(hb, right), top));
                __m512i ic = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(lo, load512(c + 128 * h)),
                                                 _mm512_permutexvar_epi16(pick[2 * h], mc));
                ic = _mm512_dpwssd_epi32(ic, _mm512_maddubs_epi16(hi, load512(c + 128 * h + 64)),
                                         _mm512_permutexvar_epi16(pick[2 * h + 1], mc));
                fc = _mm512_add_ps(fc, _mm512_cvtepi32_ps(ic));
            }
            acc = _mm512_fmadd_ps(fc, _mm512_set1_ps(d * x.super_steps[static_cast<size_t>(k)]), acc);
        }
        p.y[r - r0] = _mm512_reduce_add_ps(acc) - 32.f * _mm512_reduce_add_ps(offset);
    }
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
