// The AVX2 + FMA path of token_peaks (token_peaks.h): keys transposed into panels of 8, so a
// query row's scores for 8 keys are one FMA chain over head_dim with no horizontal sums; four
// query rows share each panel load. Work is split over (kv head, tile of query rows); each thread
// keeps its own per-key maxima of score - lse, merged (and exponentiated once per key) at the end.
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
    // Panels: head h's keys [8P, 8P + 8) as [hd][8] (the layout's zeros pad past n_keys).
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < p.n_keys[h]; ++j) {
            float* panel = lay.keys_t + lay.panel_at[h] + static_cast<size_t>(j / kPanel) * kPanel * hd + j % kPanel;
            const float* row = p.k[h] + static_cast<size_t>(j) * hd;
            for (int d = 0; d < hd; ++d) panel[static_cast<size_t>(d) * kPanel] = row[d];
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
            for (int P = 0; P < n_panels; ++P) {
                const float* panel = panels + static_cast<size_t>(P) * kPanel * hd;
                __m256 acc[kRows] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int d = 0; d < hd; ++d) {
                    const __m256 kv = _mm256_loadu_ps(panel + static_cast<size_t>(d) * kPanel);
                    for (int i = 0; i < kRows; ++i) acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(q[i] + d), kv, acc[i]);
                }
                for (int i = 0; i < kRows; ++i)
                    _mm256_storeu_ps(scores + i * max_keys + static_cast<size_t>(P) * kPanel,
                                     _mm256_mul_ps(acc[i], _mm256_set1_ps(scale)));
            }
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
