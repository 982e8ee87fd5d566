// Shape and limits of a KvCache (kv_cache.h), in a header of its own so that the parts the cache
// owns (h2o_state.h) can size themselves from it without including the cache.
#pragma once

#include "mnn_h2o/attention/attention.h"

namespace mnn_h2o {

struct KvCacheConfig {
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;      // multiple of 16 in [16, 256]
    int n_heads = 0;       // query heads, a multiple of n_kv_heads (GQA)
    KvDtype dtype = KvDtype::F16;
    int block_tokens = 64; // multiple of 16
    int max_tokens = 8192; // per (layer, kv head)
    int threads = 1;       // attention threads, counting the caller
};

}  // namespace mnn_h2o
