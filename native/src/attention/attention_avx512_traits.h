// The AVX-512 (F/BW/VL, with F16C) traits of the SIMD attention kernels, shared by the plain set
// (attention_avx512.cpp), the VNNI one (attention_avx512vnni.cpp), which adds int8 dot products
// where the includer is compiled with VNNI, and the BF16 one (attention_avx512bf16.cpp), which
// adds bf16 dot products to those. An anonymous namespace: each includer, compiled with its own
// flags, gets its own copy.
//
// Includers provide <immintrin.h>, <cstddef>, <cstdint> and attention_kernels.h.
#pragma once

namespace mnn_h2o {
namespace kernels {
namespace {

struct Avx512 {
    static constexpr const char* kName = "avx512";
    using vec = __m512;
    static constexpr int W = 16;
    static constexpr int kDecodeRows = 6;  // 24 accumulators (4 keys x 6 rows) of 32 registers: a 1.5B's group in one pass
    static constexpr int kTileKeys = 8;    // 16 accumulators (8 keys x 2 row vectors)
    static constexpr int kPvCols = 8;      // 16 accumulators (8 value columns x 2 row vectors)
    static constexpr bool kInt8Scores = false;
    static constexpr bool kBf16Values = false;

    static vec zero() { return _mm512_setzero_ps(); }
    static vec set1(float x) { return _mm512_set1_ps(x); }
    static vec load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
    static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
    static vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
    static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
    static float hsum(vec v) { return _mm512_reduce_add_ps(v); }
    static float hmax(vec v) { return _mm512_reduce_max_ps(v); }

    // out[i] = horizontal sum of the i-th vector, sharing the shuffles between the four.
    static void reduce4(vec a, vec b, vec c, vec d, float* out) {
        // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d.
        const vec ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        const vec cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
        // Per lane: [a, b, c, d] partial sums over the lane.
        const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
        const __m512d lanes = _mm512_castps_pd(_mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                                             _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd))));
        const __m256 half = _mm256_add_ps(_mm256_castpd_ps(_mm512_castpd512_pd256(lanes)),
                                          _mm256_castpd_ps(_mm512_extractf64x4_pd(lanes, 1)));
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1)));
    }

    static vec round(vec v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    // 2^n for integral n in [-126, 127].
    static vec pow2n(vec n) {
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    static vec select_lt(vec a, vec b, vec x, vec y) {
        return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
    }
    // s holds each lane's partner x[i ^ L]; the blend takes s - x where i & L is set.
    template <int L>
    static vec butterfly(vec x) {
        vec s;
        if constexpr (L == 1) s = _mm512_permute_ps(x, 0xB1);
        else if constexpr (L == 2) s = _mm512_permute_ps(x, 0x4E);
        else if constexpr (L == 4) s = _mm512_shuffle_f32x4(x, x, 0xB1);
        else s = _mm512_shuffle_f32x4(x, x, 0x4E);
        constexpr __mmask16 hi = L == 1 ? 0xAAAA : L == 2 ? 0xCCCC : L == 4 ? 0xF0F0 : 0xFF00;
        return _mm512_mask_blend_ps(hi, _mm512_add_ps(x, s), _mm512_sub_ps(s, x));
    }

    static vec load_f16(const uint16_t* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static vec load_bf16(const uint16_t* p) {
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    }
    static void store_f16(uint16_t* p, vec v) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                            _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // Round to nearest even on the upper 16 bits; NaN stays NaN (made quiet), as fp32_to_bf16.
    static void store_bf16(uint16_t* p, vec v) {
        const __m512i u = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
        const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        const __m512i r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, nan);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
    }

    static vec load_i8(const int8_t* p) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
    static vec load_u4(const uint8_t* p) {
        const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), mask = _mm_set1_epi8(0x0F);
        const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
    }
    static float half(uint16_t h) { return _cvtsh_ss(h); }
};

#if defined(__AVX512VNNI__)
struct Avx512Vnni : Avx512 {
    static constexpr const char* kName = "avx512-vnni";
    static constexpr bool kInt8Scores = true;
    using ivec = __m512i;  // W int32 lanes, each the dot product of 4 byte pairs

    static ivec iload(const int8_t* p) { return _mm512_loadu_si512(p); }
    static ivec izero() { return _mm512_setzero_si512(); }
    static ivec iload32(const int32_t* p) { return _mm512_loadu_si512(p); }
    // 4 bytes broadcast to every lane.
    static ivec ibroadcast4(const uint8_t* p) {
        int32_t x;
        __builtin_memcpy(&x, p, sizeof x);
        return _mm512_set1_epi32(x);
    }
    // acc + the dot products of unsigned bytes u and signed bytes s, 4 per lane (exact: no
    // saturation in vpdpbusd).
    static ivec idot(ivec acc, ivec u, ivec s) { return _mm512_dpbusd_epi32(acc, u, s); }
    static vec to_float(ivec v) { return _mm512_cvtepi32_ps(v); }
};
#endif  // __AVX512VNNI__

}  // namespace
}  // namespace kernels
}  // namespace mnn_h2o
