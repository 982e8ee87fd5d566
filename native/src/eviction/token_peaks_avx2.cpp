// The AVX2 + FMA path of token_peaks (token_peaks.h): keys transposed into panels of 8, so a
// query row's scores for 8 keys are one FMA chain over head_dim with no horizontal sums; four
// query rows share each panel load and three panels each query broadcast. Work is split over (kv
// head, tile of query rows); each thread keeps its own per-key maxima of score - lse, merged (and
// exponentiated once per key) at the end.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <cmath>
#include <cstddef>

#include "token_peaks_kernels.h"

namespace mnn_h2o {

namespace {

constexpr int kPanel = 8;      // keys per panel (one AVX2 vector)
constexpr int kRows = kTokenPeakRows;
constexpr int kTileRows = 32;  // query rows per task
constexpr int kPanelsPerPass = 3;  // 12 sums, 3 panels and a broadcast: the 16 AVX2 registers

int imin(int a, int b) { return a < b ? a : b; }

// exp(x) for x <= 88 (Cephes expf polynomial after range reduction by ln 2, as the attention
// kernels); below -87.3, including -inf, exactly 0.
__m256 vexp(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
    const __m256 xc = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.9875691500e-4f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894e-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459e-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(q, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 scaled = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(scaled, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}

// dst[i * 8 + r] = src[r * stride + i] for r, i in [0, 8): eight rows' 8 floats into 8 columns.
void transpose8(const float* src, int stride, float* dst) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + static_cast<size_t>(i) * stride);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    // r[0..3] hold columns 0, 1, 2, 3 of rows 0-3 (low lanes) and 4, 5, 6, 7 (high lanes); r[4..7]
    // the same for rows 4-7.
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + i * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

// scores[i * stride + 8P + c] = scale * (q[i] . key c of panel P) for P in [0, NP): the kRows
// rows' products with NP consecutive panels. Each panel load serves every row and each query
// broadcast every panel; the kRows * NP independent sums hide the FMA latency (one panel's four
// sums alone left the loop waiting on it). Each sum runs over d in order: the same result
// whatever NP.
template <int NP>
void panel_scores(const float* const* q, const float* panel, int hd, float scale, float* scores, size_t stride) {
    __m256 acc[kRows * NP];  // [row][panel]
    for (int k = 0; k < kRows * NP; ++k) acc[k] = _mm256_setzero_ps();
    const size_t panel_size = static_cast<size_t>(kPanel) * hd;
    for (int d = 0; d < hd; ++d) {
        __m256 kv[NP];
        for (int P = 0; P < NP; ++P) kv[P] = _mm256_loadu_ps(panel + P * panel_size + static_cast<size_t>(d) * kPanel);
        for (int i = 0; i < kRows; ++i) {
            const __m256 qv = _mm256_broadcast_ss(q[i] + d);
            for (int P = 0; P < NP; ++P) acc[i * NP + P] = _mm256_fmadd_ps(qv, kv[P], acc[i * NP + P]);
        }
    }
    // Unrolled in full: otherwise GCC 12 keeps acc in memory and stores every sum at every d.
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 16
        for (int P = 0; P < NP; ++P)
            _mm256_storeu_ps(scores + i * stride + P * kPanel, _mm256_mul_ps(acc[i * NP + P], _mm256_set1_ps(scale)));
}

float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

}  // namespace

void token_peaks_avx2(const TokenPeakProblem& p, Team* threads, const TokenPeakLayout& lay) {
    const int H = p.n_kv_heads, G = p.group, hd = p.head_dim, n_heads = H * G;
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    const size_t max_keys = lay.max_keys, max_peak = lay.max_peak;
    // Panels: head h's keys [8P, 8P + 8) as [hd][8], zeros past n_keys.
    for (int h = 0; h < H; ++h) {
        const int n = p.n_keys[h], full = n / kPanel * kPanel;
        float* panels = lay.keys_t + lay.panel_at[h];
        for (int j = 0; j < full; j += kPanel)
            for (int d = 0; d < hd; d += kPanel)
                transpose8(p.k[h] + static_cast<size_t>(j) * hd + d, hd,
                           panels + static_cast<size_t>(j) * hd + static_cast<size_t>(d) * kPanel);
        if (full == n) continue;
        float* panel = panels + static_cast<size_t>(full) * hd;
        for (int d = 0; d < hd; ++d)
            for (int i = 0; i < kPanel; ++i)
                panel[static_cast<size_t>(d) * kPanel + i] = full + i < n ? p.k[h][static_cast<size_t>(full + i) * hd + d] : 0.f;
    }
    const int n_threads = lay.n_threads;
    const size_t score_size = kRows * max_keys, best_size = static_cast<size_t>(H) * max_peak;

    const int rows = p.n_q * G;  // a head's rows, query-major: row r is query r / G, query head r % G
    const int tiles = (rows + kTileRows - 1) / kTileRows;
    const auto task = [&](int t, int thread) {
        const int h = t / tiles, first = (t % tiles) * kTileRows, last = imin(rows, first + kTileRows);
        const float* panels = lay.keys_t + lay.panel_at[h];
        float* scores = lay.scores + static_cast<size_t>(thread) * score_size;
        float* best = lay.best + static_cast<size_t>(thread) * best_size + static_cast<size_t>(h) * max_peak;
        for (int r0 = first; r0 < last; r0 += kRows) {
            const int nr = imin(kRows, last - r0);
            const float* q[kRows];
            int visible[kRows];
            for (int i = 0; i < kRows; ++i) {
                const int r = r0 + imin(i, nr - 1);  // rows past the tile repeat its last (ignored)
                q[i] = p.q + (static_cast<size_t>(r / G) * n_heads + static_cast<size_t>(h) * G + r % G) * hd;
                visible[i] = p.n_keys[h] - p.n_q + r / G + 1;
            }
            const int n_panels = (visible[kRows - 1] + kPanel - 1) / kPanel;
            int P = 0;
            for (; P + kPanelsPerPass <= n_panels; P += kPanelsPerPass)
                panel_scores<kPanelsPerPass>(q, panels + static_cast<size_t>(P) * kPanel * hd, hd, scale,
                                             scores + static_cast<size_t>(P) * kPanel, max_keys);
            for (; P < n_panels; ++P)
                panel_scores<1>(q, panels + static_cast<size_t>(P) * kPanel * hd, hd, scale,
                                scores + static_cast<size_t>(P) * kPanel, max_keys);
            for (int i = 0; i < nr; ++i) {
                float* s = scores + i * max_keys;
                const int end = (visible[i] + kPanel - 1) / kPanel * kPanel;
                for (int j = visible[i]; j < end; ++j) s[j] = -INFINITY;  // causal: keys this row does not see
                __m256 m = _mm256_set1_ps(-INFINITY);
                for (int j = 0; j < end; j += kPanel) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
                const float row_max = hmax(m);
                const __m256 mv = _mm256_set1_ps(row_max);
                __m256 l = _mm256_setzero_ps();
                for (int j = 0; j < end; j += kPanel) l = _mm256_add_ps(l, vexp(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)));
                const __m256 lse = _mm256_set1_ps(row_max + std::log(hsum(l)));
                const int peak_end = (imin(visible[i], p.n_peak[h]) + kPanel - 1) / kPanel * kPanel;
                for (int j = 0; j < peak_end; j += kPanel)
                    _mm256_storeu_ps(best + j, _mm256_max_ps(_mm256_loadu_ps(best + j),
                                                             _mm256_sub_ps(_mm256_loadu_ps(s + j), lse)));
            }
        }
    };
    if (threads) threads->parallel_for(H * tiles, task);
    else for (int t = 0; t < H * tiles; ++t) task(t, 0);

    for (int h = 0; h < H; ++h) {
        float* peak = p.peak + static_cast<size_t>(h) * p.peak_stride;
        for (int j = 0; j < p.n_peak[h]; ++j) {
            float m = -INFINITY;
            for (int t = 0; t < n_threads; ++t) {
                const float b = lay.best[t * best_size + h * max_peak + j];
                m = b > m ? b : m;
            }
            const float e = std::exp(m);  // 0 for a key no row saw
            peak[j] = e > peak[j] ? e : peak[j];
        }
    }
}

}  // namespace mnn_h2o

#endif
