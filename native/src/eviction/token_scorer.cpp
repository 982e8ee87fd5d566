#include "mnn_h2o/eviction/token_scorer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mnn_h2o {

namespace {
constexpr double kEps = 1e-6;  // token_scorer.py's _EPS
}

TokenScorer::TokenScorer(const std::vector<float>& weights, int n_layers, int hidden, int n_kv_heads, int layer_start,
                         int layer_end)
    : n_layers_(n_layers),
      hidden_(hidden),
      n_kv_heads_(n_kv_heads),
      layer_start_(layer_start),
      layer_end_(layer_end) {
    if (n_layers < 1 || hidden < 1 || n_kv_heads < 1)
        throw std::invalid_argument("TokenScorer: n_layers, hidden and n_kv_heads must be positive");
    const size_t want = static_cast<size_t>(n_layers) * (hidden + 1) * n_kv_heads;
    if (weights.size() != want)
        throw std::invalid_argument("TokenScorer: " + std::to_string(weights.size()) + " weights, the shape [" +
                                    std::to_string(n_layers) + ", " + std::to_string(hidden + 1) + ", " +
                                    std::to_string(n_kv_heads) + "] holds " + std::to_string(want));
    if (!(0 <= layer_start && layer_start < layer_end && layer_end <= n_layers))
        throw std::invalid_argument("TokenScorer: layers [" + std::to_string(layer_start) + ", " +
                                    std::to_string(layer_end) + ") not within [0, " + std::to_string(n_layers) + ")");
    for (float w : weights)
        if (!std::isfinite(w)) throw std::invalid_argument("TokenScorer: a weight is not finite");
    by_head_.resize(weights.size());
    const size_t d_all = static_cast<size_t>(hidden) + 1;
    for (size_t layer = 0; layer < static_cast<size_t>(n_layers); ++layer)
        for (size_t d = 0; d < d_all; ++d)
            for (size_t k = 0; k < static_cast<size_t>(n_kv_heads); ++k)
                by_head_[(layer * n_kv_heads + k) * d_all + d] = weights[(layer * d_all + d) * n_kv_heads + k];
}

namespace {

// Sum of a[d] * b[d] over n floats in eight partial sums (independent lanes the compiler keeps in
// vector registers), added up in double.
double dot8(const float* a, const float* b, int n) {
    float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int j = 0; j < 8; ++j) part[j] += a[d + j] * b[d + j];
    double sum = 0.0;
    for (int j = 0; j < 8; ++j) sum += part[j];
    for (; d < n; ++d) sum += static_cast<double>(a[d]) * b[d];
    return sum;
}

}  // namespace

bool TokenScorer::scores(int layer, const float* h, int n_rows, float* out) const {
    if (layer < layer_start_ || layer >= layer_end_) return false;
    if (n_rows < 0) throw std::invalid_argument("TokenScorer: n_rows must be >= 0");
    const int H = n_kv_heads_;
    // Head k's weights of the layer, contiguous: by_head_[(layer * H + k) * (hidden + 1) + d].
    const float* w = by_head_.data() + static_cast<size_t>(layer) * H * (hidden_ + 1);
    for (int r = 0; r < n_rows; ++r) {
        const float* x = h + static_cast<size_t>(r) * hidden_;
        const double inv_rms = 1.0 / std::sqrt(dot8(x, x, hidden_) / hidden_ + kEps);
        for (int k = 0; k < H; ++k) {
            // [x / rms, 1] . w = (x . w) / rms + the constant's weight.
            const float* wk = w + static_cast<size_t>(k) * (hidden_ + 1);
            const double logit = dot8(x, wk, hidden_) * inv_rms + wk[hidden_];
            out[static_cast<size_t>(k) * n_rows + r] = static_cast<float>(std::exp(std::min(logit, 0.0)));
        }
    }
    return true;
}

}  // namespace mnn_h2o
