// Shape and limits of a KvCache (kv_cache.h), in a header of its own so that the parts the cache
// owns (h2o_state.h) can size themselves from it without including the cache.
#pragma once

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/config_schema.h"

namespace mnn_h2o {

// dtype, block_tokens and threads are the config keys runtime.kv_dtype, runtime.block_tokens and
// runtime.threads: their defaults and allowed values are the schema's (docs/config.md).
struct KvCacheConfig {
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;      // multiple of 16 in [16, 256]
    int n_heads = 0;       // query heads, a multiple of n_kv_heads (GQA)
    KvDtype dtype = static_cast<KvDtype>(schema::runtime::kv_dtype::kDefaultIndex);
    int block_tokens = schema::runtime::block_tokens::kDefault;
    // Not a config key: the engine sizes it from runtime.max_context and the model's own limit.
    int max_tokens = 8192; // per (layer, kv head)
    int threads = schema::runtime::threads::kDefault;  // attention threads, counting the caller
};

}  // namespace mnn_h2o
