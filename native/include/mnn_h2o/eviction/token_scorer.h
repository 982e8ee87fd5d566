// eviction.policy predicted_kvzip's map, applied in the core (its file, its fit and its reference
// are mnn_h2o/token_scorer.py): per layer, the predicted reconstruction score of a token for each
// kv head from the layer's input hidden state h,
//
//     score[head] = exp(min(0, [h / rms(h), 1] . W[layer][:, head])),  rms(h) = sqrt(mean(h^2) + 1e-6),
//
// W [n_layers][hidden + 1][n_kv_heads]. In the core so that a decode token's layers (decode_token)
// score it without a call back into Python at every layer (2.2 ms a token on the 1.5B, 28 layers).
#pragma once

#include <vector>

namespace mnn_h2o {

class TokenScorer {
public:
    // Layers [layer_start, layer_end) score; the others have no map (scores() returns false).
    // std::invalid_argument if weights is not n_layers * (hidden + 1) * n_kv_heads floats, a
    // weight is not finite, or the range is not within [0, n_layers).
    TokenScorer(const std::vector<float>& weights, int n_layers, int hidden, int n_kv_heads, int layer_start, int layer_end);

    // out [n_kv_heads][n_rows]: the scores of rows h [n_rows][hidden] at layer, in (0, 1]; false
    // (out untouched) for a layer outside the range. Products summed in eight float lanes, then
    // in double.
    bool scores(int layer, const float* h, int n_rows, float* out) const;

    int n_layers() const { return n_layers_; }
    int hidden() const { return hidden_; }
    int n_kv_heads() const { return n_kv_heads_; }

private:
    std::vector<float> by_head_;  // the weights of each layer's heads, each head's contiguous
    int n_layers_, hidden_, n_kv_heads_, layer_start_, layer_end_;
};

}  // namespace mnn_h2o
