// AVX2 + FMA + F16C instantiation of the SIMD attention kernels.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "attention_kernels.h"

namespace mnn_h2o {
namespace kernels {
namespace {

struct Avx2 {
    static constexpr const char* kName = "avx2";
    using vec = __m256;
    static constexpr int W = 8;
    // 16 registers: 4 keys x 3 rows of accumulators + 3 query vectors fill them.
    static constexpr int kDecodeRows = 3;
    static constexpr int kTileKeys = 4;  // 8 accumulators (4 keys x 2 row vectors)
    static constexpr int kPvCols = 4;    // 8 accumulators (4 value columns x 2 row vectors)
    static constexpr bool kInt8Scores = false;
    static constexpr bool kBf16Values = false;

    static vec zero() { return _mm256_setzero_ps(); }
    static vec set1(float x) { return _mm256_set1_ps(x); }
    static vec load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
    static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
    static vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
    static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
    static float hsum(vec v) {
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
    }
    static float hmax(vec v) {
        __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
    }
    static void reduce4(vec a, vec b, vec c, vec d, float* out) {
        // hadd(hadd(a,b), hadd(c,d)) leaves [a, b, c, d] partial sums in each 128-bit half.
        const vec abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
    }

    static vec round(vec v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static vec pow2n(vec n) {
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    }
    static vec select_lt(vec a, vec b, vec x, vec y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
    // s holds each lane's partner x[i ^ L]; the blend takes s - x where i & L is set.
    template <int L>
    static vec butterfly(vec x) {
        if constexpr (L == 1) {
            const vec s = _mm256_permute_ps(x, 0xB1);
            return _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xAA);
        } else if constexpr (L == 2) {
            const vec s = _mm256_permute_ps(x, 0x4E);
            return _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xCC);
        } else {
            const vec s = _mm256_permute2f128_ps(x, x, 0x01);
            return _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xF0);
        }
    }

    static vec load_f16(const uint16_t* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    static vec load_bf16(const uint16_t* p) {
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
    }
    static void store_f16(uint16_t* p, vec v) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    static void store_bf16(uint16_t* p, vec v) {
        const __m256i u = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
        const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        const __m256i r = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        // Every lane is in [0, 0xFFFF], so the unsigned saturating pack is exact.
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    }

    static vec load_i8(const int8_t* p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
    static vec load_u4(const uint8_t* p) {
        int32_t bytes;
        __builtin_memcpy(&bytes, p, sizeof bytes);
        const __m128i x = _mm_cvtsi32_si128(bytes), mask = _mm_set1_epi8(0x0F);
        const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
    }
    static float half(uint16_t h) { return _cvtsh_ss(h); }
};

}  // namespace
}  // namespace kernels
}  // namespace mnn_h2o

#include "attention_simd.h"

namespace mnn_h2o {
namespace kernels {

const KernelSet& avx2_kernels() {
    static constexpr KernelSet set = simd::kernel_set<Avx2>();
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
