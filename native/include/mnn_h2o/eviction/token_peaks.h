// Per-token peaks of a context reconstruction pass (KVzip, docs/eviction.md "Reconstruction"): for
// each key of a kv head, the largest softmax probability any of a step's queries (any query head
// of the group) gives it. The attention kernels' online softmax never holds a normalised
// probability per key, so this is a second, separate pass over the step's scores: per query row
// the log-sum-exp over every key the row sees (causal, as the kernels), then per key the largest
// exp(q.k * scale - lse).
#pragma once

#include <cstddef>
#include <vector>

#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/runtime/team.h"

namespace mnn_h2o {

struct TokenPeakProblem {
    int n_kv_heads = 0, group = 0, head_dim = 0;
    const float* q = nullptr;  // the step's queries [n_q][n_kv_heads * group][head_dim]
    int n_q = 0;
    // Per kv head: its keys as f32 [n_keys[h]][head_dim], in the space of q (the stored space).
    // Query i of the step sees keys [0, n_keys[h] - n_q + i + 1).
    const float* const* k = nullptr;
    const int* n_keys = nullptr;
    // Per kv head: peaks are kept for keys [0, n_peak[h]) (<= n_keys[h]):
    // peak[h * peak_stride + j] = max(itself, the step's largest probability for key j).
    const int* n_peak = nullptr;
    float* peak = nullptr;
    size_t peak_stride = 0;
};

// Scratch reused between calls (grows to the largest problem, then allocates nothing).
struct TokenPeakWorkspace {
    std::vector<float> keys_t;   // SIMD: each head's keys transposed in panels of 8
    std::vector<size_t> panel_at;
    std::vector<float> scores;   // per thread: a tile of query rows' scores
    std::vector<float> best;     // per thread and head: max over rows of (score - lse), per key
};

// Adds the step's peaks to p.peak. Isa::Scalar is the plain reference (std::exp, one row at a
// time); Avx2 and Avx512 take the AVX2 path (8-key panels, a polynomial exp), threaded over
// (kv head, row tile) when `threads` is given. Other ISAs fall back to the reference.
// Throws std::invalid_argument for a malformed problem.
void token_peaks(const TokenPeakProblem& p, Isa isa, Team* threads, TokenPeakWorkspace& ws);

}  // namespace mnn_h2o
