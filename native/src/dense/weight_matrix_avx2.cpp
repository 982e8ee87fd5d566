// AVX2 row kernels of WeightMatrix (weight_matrix_kernels.h), on the activation's k-quant
// form (q4_matrix.h): a super-block's integer dots summed in int32 before any float. Per block of
// 32 weights: maddubs of the unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) with the
// activation's codes (at most 2 x 63 x 127 per int16: no saturation), then madd with the int16
// product of the sub-block's weight scale and the activation block's multiplier (Q4_K <= 63 x 128,
// Q6_K |.| <= 128 x 128); the int32 lanes meet the floats (the weight's d, the activation's
// super-block step) once per super-block (Q4_K: at most 8 x 2 x 3810 x 8064 < 2^31 per lane) or
// per pair of blocks (Q6_K: 2 x 2 x 16002 x 16384 < 2^31). Q4_K's mins and the rounding errors'
// part, and Q6_K's offset of 32, meet the activation's float sums in vectors. AVX-512 VNNI
// machines run these for Q5_0 / Q8_0 (the k-quants: weight_matrix_avx512vnni.cpp).
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include <immintrin.h>

#include <cstring>

#include "kquant_scales_x86.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {

namespace {

inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// F16C's conversion (the portable one in cache/fp16.h branches per value: most of a
// super-block's time here).
inline float half_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

inline float hsum(__m256 acc) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

inline __m256 i8_floats(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// kPick[j]: the vpshufb index that spreads int16 lane j of a 128-bit lane over all 16 (per lane);
// the sub-blocks' multipliers stay in one register instead of a round trip through a general
// register per broadcast.
alignas(32) constexpr int8_t kPick[8][32] = {
#define MNN_H2O_PICK(j) {2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, \
                         2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, \
                         2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1}
    MNN_H2O_PICK(0), MNN_H2O_PICK(1), MNN_H2O_PICK(2), MNN_H2O_PICK(3),
    MNN_H2O_PICK(4), MNN_H2O_PICK(5), MNN_H2O_PICK(6), MNN_H2O_PICK(7),
#undef MNN_H2O_PICK
};

inline __m256i pick(__m256i m, int j) { return _mm256_shuffle_epi8(m, load(kPick[j])); }

// w (unsigned bytes) . c (signed) per pair of bytes, times the int16 multipliers m, summed by four.
inline __m256i scaled_dot(__m256i w, __m256i c, __m256i m) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, c), m); }

}  // namespace

// Q4_K and Q5_K: Q5_K's fifth bit (qh, weight_types.h) joins each value as 16 before the dots
// (values 0..31: maddubs at most 2 x 31 x 127; the int32 lanes at most 8 x 2 x 7874 x 8064 < 2^31).
template <bool kFifthBit>
static void q45_k_rows(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    constexpr float kCentre = kFifthBit ? kQ5KCentre : kQ4KCentre;
    const Q8Activation& x = *p.x;
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        // acc: the dots; sums: the mins against the block sums, less the errors' part at the centre
        __m256 acc = _mm256_setzero_ps(), sums = _mm256_setzero_ps();
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * kBytes;
            prefetch_ahead<kBytes>(b);
            const __m128i sm = kquant_scales_mins(b + 4);  // 8 scales, 8 mins
            const __m128 dd = kquant_d_dmin(b);
            const float d = _mm_cvtss_f32(dd);
            const __m256i mc = _mm256_broadcastsi128_si256(_mm_mullo_epi16(
                _mm_cvtepu8_epi16(sm), _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.multipliers.data() + 8 * k))));
            const __m256 mv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))),
                                            _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
            sums = _mm256_fmadd_ps(mv, _mm256_loadu_ps(x.sums.data() + 8 * k), sums);
            const __m256 sv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)), _mm256_set1_ps(d * kCentre));
            sums = _mm256_fnmadd_ps(sv, _mm256_loadu_ps(x.rounding_errors.data() + 8 * k), sums);
            const int8_t* c = x.seq_codes.data() + static_cast<size_t>(k) * 256;
            // The fifth bits of sub-block j are bit j of qh's 32 bytes: shifted to bit 0 within
            // 16-bit lanes (a byte's bit 0 is then its own bit j), masked, times 16.
            const __m256i qh = kFifthBit ? load(b + 16) : _mm256_setzero_si256();
            auto fifth = [&](int j) {
                return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), one), 4);
            };
            __m256i ic = _mm256_setzero_si256();
            for (int g = 0; g < 4; ++g) {
                const __m256i v = load(b + kQs + 32 * g);
                __m256i lo = _mm256_and_si256(v, low);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                const int j = 2 * g;
                if (kFifthBit) {
                    lo = _mm256_or_si256(lo, fifth(j));
                    hi = _mm256_or_si256(hi, fifth(j + 1));
                }
                ic = _mm256_add_epi32(ic, scaled_dot(lo, load(c + 32 * j), pick(mc, j)));
                ic = _mm256_add_epi32(ic, scaled_dot(hi, load(c + 32 * j + 32), pick(mc, j + 1)));
            }
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ic), _mm256_set1_ps(d * x.super_steps[static_cast<size_t>(k)]), acc);
        }
        p.y[r - r0] = hsum(acc) - hsum(sums);
    }
}

void q4_k_rows_avx2(const BlockRows& p, int r0, int r1) { q45_k_rows<false>(p, r0, r1); }
void q5_k_rows_avx2(const BlockRows& p, int r0, int r1) { q45_k_rows<true>(p, r0, r1); }

void q6_k_rows_avx2(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const __m256i low = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    // int16 lanes 0-7 (values 0-15 of a block) take multiplier s, lanes 8-15 take s + 1.
    const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                            3, 2, 3, 2, 3);
    auto bits = [&](__m256i l, int lshift, __m256i hb, int hshift) {
        const __m256i lo = _mm256_and_si256(lshift ? _mm256_srli_epi16(l, 4) : l, low);
        const __m256i hi = _mm256_and_si256(hshift ? _mm256_srli_epi16(hb, hshift) : hb, two);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    };
    // {m[2 blk] x 8, m[2 blk + 1] x 8} as int16, from the sixteen multipliers m in one register.
    auto pair = [&](__m256i m, int blk) {
        return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(m, _mm256_set1_epi32(blk)), halves);
    };
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m256 acc = _mm256_setzero_ps(), offset = _mm256_setzero_ps();
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 210;
            prefetch_ahead<210>(b);
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const float d = half_at(b + 208);
            const __m256 dv = _mm256_set1_ps(d);
            const float* rs = x.rounded_sums16.data() + 16 * k;
            offset = _mm256_fmadd_ps(_mm256_mul_ps(i8_floats(sc), dv), _mm256_loadu_ps(rs), offset);
            offset = _mm256_fmadd_ps(_mm256_mul_ps(i8_floats(sc + 8), dv), _mm256_loadu_ps(rs + 8), offset);
            // Sub-block j's multipliers: its scale times its activation block's multiplier.
            const __m128i sh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.multipliers.data() + 8 * k));
            const __m128i s_lo = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
            const __m128i s_hi = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8)));
            const __m256i mc = _mm256_set_m128i(_mm_mullo_epi16(s_hi, _mm_unpackhi_epi16(sh, sh)),
                                                _mm_mullo_epi16(s_lo, _mm_unpacklo_epi16(sh, sh)));
            const int8_t* c = x.seq_codes.data() + static_cast<size_t>(k) * 256;
            __m256 fc = _mm256_setzero_ps();
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = load(b + 64 * h), l1 = load(b + 64 * h + 32), hb = load(b + 128 + 32 * h);
                const __m256i q[4] = {bits(l0, 0, hb, 0), bits(l1, 0, hb, 2), bits(l0, 4, hb, 4), bits(l1, 4, hb, 6)};
                for (int t = 0; t < 4; t += 2) {  // two blocks into int32, then float
                    const int blk = 4 * h + t;
                    __m256i ic = scaled_dot(q[t], load(c + 32 * blk), pair(mc, blk));
                    ic = _mm256_add_epi32(ic, scaled_dot(q[t + 1], load(c + 32 * blk + 32), pair(mc, blk + 1)));
                    fc = _mm256_add_ps(fc, _mm256_cvtepi32_ps(ic));
                }
            }
            acc = _mm256_fmadd_ps(fc, _mm256_set1_ps(d * x.super_steps[static_cast<size_t>(k)]), acc);
        }
        p.y[r - r0] = hsum(acc) - 32.f * hsum(offset);
    }
}

// Q5_0 and Q8_0 (signed codes, one d per block of 32) on the activation's pair form: a block's
// 32 weights against its codes gathered from the pair layout's two halves; the signed product as
// maddubs of |w| (at most 128 as an unsigned byte) with the codes carrying w's sign (at most 2 x
// 128 x 127 per int16), then float per block.
template <bool kQ5>
static void signed_rows(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kQ5 ? 22 : 34;
    const Q8Activation& x = *p.x;
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    // Q5_0's fifth bits: value i takes byte i / 8 of qh (per 128-bit lane: values 0-15, 16-31)
    // and tests bit i % 8.
    const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                           3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < p.cols / 32; ++b) {
            const uint8_t* blk = row + static_cast<size_t>(b) * kBytes;
            if (b % 2 == 0) prefetch_ahead<2 * kBytes>(blk);
            __m256i w;
            if (kQ5) {
                const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
                const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low);
                uint32_t qh;
                std::memcpy(&qh, blk + 2, 4);
                const __m256i set = _mm256_cmpeq_epi8(
                    _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), which), bit), bit);
                w = _mm256_sub_epi8(_mm256_or_si256(n, _mm256_and_si256(set, sixteen)), sixteen);
            } else {
                w = load(blk + 2);
            }
            const int8_t* c = pair_codes(x, b);
            const __m256i cv = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 32)),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
            const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(cv, w)), ones);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(half_at(blk) * x.scales[static_cast<size_t>(b)]), acc);
        }
        p.y[r - r0] = hsum(acc);
    }
}

void q5_0_rows_avx2(const BlockRows& p, int r0, int r1) { signed_rows<true>(p, r0, r1); }
void q8_0_rows_avx2(const BlockRows& p, int r0, int r1) { signed_rows<false>(p, r0, r1); }

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
