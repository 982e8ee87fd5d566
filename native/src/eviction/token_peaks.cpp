#include "mnn_h2o/eviction/token_peaks.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "token_peaks_kernels.h"

namespace mnn_h2o {

namespace {

void check(const TokenPeakProblem& p) {
    const auto bad = [](const std::string& what) { throw std::invalid_argument("token_peaks: " + what); };
    if (p.n_kv_heads < 1 || p.group < 1 || p.head_dim < 1 || p.head_dim % 8 != 0)
        bad("n_kv_heads, group >= 1 and head_dim a positive multiple of 8 are required");
    if (p.n_q < 1 || !p.q || !p.k || !p.n_keys || !p.n_peak || !p.peak) bad("null input or n_q < 1");
    for (int h = 0; h < p.n_kv_heads; ++h) {
        if (p.n_keys[h] < p.n_q || !p.k[h])
            bad("kv head " + std::to_string(h) + " holds fewer keys than the step's queries");
        if (p.n_peak[h] < 0 || p.n_peak[h] > p.n_keys[h] || static_cast<size_t>(p.n_peak[h]) > p.peak_stride)
            bad("kv head " + std::to_string(h) + ": n_peak must be in [0, n_keys] and fit peak_stride");
    }
}

template <class T>
void grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

// The reference: one (query, query head) row at a time, std::exp, as the definition reads.
void token_peaks_scalar(const TokenPeakProblem& p, TokenPeakWorkspace& ws) {
    const int n_heads = p.n_kv_heads * p.group, hd = p.head_dim;
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    for (int h = 0; h < p.n_kv_heads; ++h) {
        const float* k = p.k[h];
        float* peak = p.peak + static_cast<size_t>(h) * p.peak_stride;
        ws.scores.resize(static_cast<size_t>(p.n_keys[h]));
        for (int i = 0; i < p.n_q; ++i) {
            const int visible = p.n_keys[h] - p.n_q + i + 1;
            for (int g = 0; g < p.group; ++g) {
                const float* q = p.q + (static_cast<size_t>(i) * n_heads + static_cast<size_t>(h) * p.group + g) * hd;
                float m = -INFINITY;
                for (int j = 0; j < visible; ++j) {
                    float dot = 0.f;
                    for (int d = 0; d < hd; ++d) dot += q[d] * k[static_cast<size_t>(j) * hd + d];
                    ws.scores[j] = dot * scale;
                    m = std::max(m, ws.scores[j]);
                }
                float l = 0.f;
                for (int j = 0; j < visible; ++j) l += std::exp(ws.scores[j] - m);
                const float lse = m + std::log(l);
                for (int j = 0; j < std::min(visible, p.n_peak[h]); ++j)
                    peak[j] = std::max(peak[j], std::exp(ws.scores[j] - lse));
            }
        }
    }
}

}  // namespace

void token_peaks(const TokenPeakProblem& p, Isa isa, Team* threads, TokenPeakWorkspace& ws) {
    check(p);
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma) {
        const auto round_up = [](int n) { return (static_cast<size_t>(n) + 7) / 8 * 8; };
        TokenPeakLayout lay;
        ws.panel_at.assign(static_cast<size_t>(p.n_kv_heads) + 1, 0);
        for (int h = 0; h < p.n_kv_heads; ++h) {
            ws.panel_at[h + 1] = ws.panel_at[h] + round_up(p.n_keys[h]) * p.head_dim;
            lay.max_keys = std::max(lay.max_keys, round_up(p.n_keys[h]));
            lay.max_peak = std::max(lay.max_peak, round_up(p.n_peak[h]));
        }
        lay.n_threads = threads ? threads->size() : 1;
        // Grown, never shrunk or cleared: the kernel writes every panel and score it reads.
        grow(ws.keys_t, ws.panel_at.back());
        grow(ws.scores, static_cast<size_t>(lay.n_threads) * kTokenPeakRows * lay.max_keys);
        ws.best.assign(static_cast<size_t>(lay.n_threads) * p.n_kv_heads * lay.max_peak, -INFINITY);
        lay.keys_t = ws.keys_t.data();
        lay.panel_at = ws.panel_at.data();
        lay.scores = ws.scores.data();
        lay.best = ws.best.data();
        token_peaks_avx2(p, threads, lay);
        return;
    }
#else
    (void)threads;
#endif
    (void)isa;
    token_peaks_scalar(p, ws);
}

}  // namespace mnn_h2o
