// Internal to token_peaks: the SIMD path's entry and the scratch layout token_peaks.cpp sizes
// for it (the SIMD file itself allocates nothing, see token_peaks_avx2.cpp).
#pragma once

#include <cstddef>

#include "mnn_h2o/eviction/token_peaks.h"

namespace mnn_h2o {

// Query rows that share each panel of keys (the scores scratch holds this many rows per thread).
constexpr int kTokenPeakRows = 4;

struct TokenPeakLayout {
    float* keys_t = nullptr;          // every head's key panels (the kernel fills them)
    const size_t* panel_at = nullptr; // [n_kv_heads]: where head h's panels start in keys_t
    size_t max_keys = 0;              // the longest head's keys, rounded up to 8
    size_t max_peak = 0;              // the largest n_peak, rounded up to 8
    int n_threads = 1;
    float* scores = nullptr;          // [n_threads][kTokenPeakRows][max_keys]
    float* best = nullptr;            // [n_threads][n_kv_heads][max_peak], -inf filled
};

#if defined(MNN_H2O_HAVE_X86_KERNELS)
void token_peaks_avx2(const TokenPeakProblem& p, Team* threads, const TokenPeakLayout& layout);
#endif

}  // namespace mnn_h2o
