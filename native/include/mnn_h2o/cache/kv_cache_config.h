// Shape and limits of a KvCache (kv_cache.h), in a header of its own so that the parts the cache
// owns (eviction_state.h) can size themselves from it without including the cache.
#pragma once

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/config_field.h"

#include <vector>

namespace mnn_h2o {

struct KvCacheConfig {
    // The model's shape.
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;      // multiple of 16 in [16, 256]
    int n_heads = 0;       // query heads, a multiple of n_kv_heads (GQA)
    // Not a config key: the engine sizes it from runtime.max_context and the model's own limit.
    int max_tokens = 8192; // per (layer, kv head)
    // Not a config key: the model's. Per layer, a sliding window in tokens (Gemma 3's local
    // layers: each query sees the newest `window` tokens up to itself), 0 for a global layer;
    // empty: every layer global. A window layer holds what its next query can see, less than one
    // block more, and gives the rest back as it goes (kv_cache.h).
    std::vector<int> windows;
    // The config keys runtime.* that reach the core (threads: attention threads counting the
    // caller; dtype: runtime.kv_dtype; block_tokens), from the schema's list (config_schema.h):
    // their defaults and allowed values are docs/config.md's.
#define MNN_H2O_MEMBER(field, key, CType, CppType) CppType field = schema_default<schema::runtime::key, CppType>();
    MNN_H2O_RUNTIME_FIELDS(MNN_H2O_MEMBER)
#undef MNN_H2O_MEMBER
};

}  // namespace mnn_h2o
