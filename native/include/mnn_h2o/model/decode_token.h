// One decode token through every layer of the model: each layer's dense part (DecodeLayers) and its
// cache step (KvCache: append, attention, the eviction policy's scores), and where the layers hold
// the output matrix the token's logits, in one native call, on one team of threads.
//
// Why one call: the layers' products run on a SpinTeam whose workers poll between jobs, and the
// attention ran on the cache's ThreadPool, whose workers sleep. Where the attention used both
// threads (from kParallelMinQueryKeys keys, attention.h) the SpinTeam's workers had to rest through
// it and each layer started by waking them again: 2.6-3.0 ms of layers a token on SmolLM2 at 1024
// tokens against 1.5 ms back to back. Here the cache borrows the layers' team for the token
// (KvCache::lend_team), so one team's workers stay awake from the first layer to the last and rest
// when the token is done; and since they poll, the attention splits its keys over them from
// kSplitMinProducts, where a sleeping pool would run the same splits on the caller. The results
// are those of the layer-by-layer calls bit for bit: the same products, and the attention split as
// many ways (a team of another size is not lent).
#pragma once

#include <functional>
#include <vector>

#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/dense/decode_layers.h"
#include "mnn_h2o/runtime/cpu_features.h"

namespace mnn_h2o {

// Seconds a decode token spent in each part (the engine's counters, mnn_h2o/engine.py Stats).
struct TokenTimes {
    double dense_s = 0.0;      // the layers' products (DecodeLayers::forward)
    double attention_s = 0.0;  // the cache steps
    double observe_s = 0.0;    // the observer, and the scores it returns going to the cache
    double head_s = 0.0;       // the last layer's end, the final norm and the logits (DecodeLayers::logits)
};

// Sees layer i's input hidden state (hidden floats) after the layer's cache step; returns true
// with scores filled ([n_kv_heads] floats) to hand the cache the token's predicted reconstruction
// scores for that layer (KvCache::set_token_scores), false for none. It must not call the cache.
using LayerObserver = std::function<bool(int layer, const float* h, std::vector<float>& scores)>;

// Token at one position through every layer: h [hidden] (its embedding in, the last layer's input
// hidden state out), cos / sin [head_dim] (the position's rotation; local_cos / local_sin that of
// the sliding-window layers, which rotate by a RoPE base of their own: a layer is one where its
// cache has a window, KvCache::window), q [n_heads head_dim] and k, v
// [n_kv_heads head_dim] scratch, attn [n_heads head_dim] (the last layer's attention output out).
// logits: nullptr, or [vocab] floats that the layers' head (DecodeLayers::set_head) fills in the
// same call, the team still awake (else the caller finishes the token: DecodeLayers::logits, or a
// tail). observe may be empty. Throws std::invalid_argument when the layers and the cache are not
// of one model (layer count, heads, head_dim) or logits are asked of layers without a head, and passes on what a layer, a cache step or the observer throws (the token is then
// partly in the cache: reset or truncate it).
TokenTimes decode_token(DecodeLayers& layers, KvCache& cache, float* h, const float* cos, const float* sin, float* q,
                        float* k, float* v, float* attn, Isa isa, const LayerObserver& observe = {},
                        const float* local_cos = nullptr, const float* local_sin = nullptr, float* logits = nullptr);

}  // namespace mnn_h2o
