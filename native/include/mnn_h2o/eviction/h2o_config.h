// Settings of H2O eviction (see docs/h2o.md). Field names are the Python keyword arguments of
// KvCache.enable_h2o, so a validation message names what the caller actually passed.
#pragma once

#include <cstdint>
#include <string>

namespace mnn_h2o {

struct H2oConfig {
    std::string policy = "h2o";   // a name of the registry (policy_list(), eviction_policy.h)
    int sink_tokens = 64;         // the blocks covering the first sink_tokens tokens are never evicted
    int recent_tokens = 256;      // nor those covering the last recent_tokens (>= 1: the newest token stays)
    // The sink and recent floors take at most this share of a head's budget (in [0, 1]): beyond
    // it both shrink in proportion (the recent floor to no less than the newest block), so a
    // budget smaller than the floors is still met. 0 = never shrink: a head whose floors exceed
    // its budget is left alone (skipped as floors_exceed_target).
    double max_floor_share = 1.0;
    // Budget: exactly one of the two is > 0. keep ratio: each evicting head keeps
    // target_keep_ratio * tokens_seen tokens. Lossy ratio: the keep ratio of the evicting layers is
    // chosen so that the whole model (all layers, the non-evicting ones keep everything) holds
    // 1 / target_lossy_ratio of what every token seen would take: a quantised cache dtype pays
    // its part of the ratio against f16 (q8: 32/17) and eviction the rest, none when the dtype
    // alone reaches it. (Float dtypes: the ratio is eviction's alone, in the cache's own dtype.)
    // A third way: kv_budget_bytes > 0 caps the bytes the whole model's K and V blocks take (all
    // layers, in the cache dtype, so a quantised dtype fits more tokens): the evicting layers'
    // heads share what the layers that keep everything leave. Exactly one of the three is > 0.
    double target_keep_ratio = 0.0;
    double target_lossy_ratio = 3.0;
    int64_t kv_budget_bytes = 0;
    double ema_alpha = 0.5;       // weight of the old score at each update, in [0, 1)
    int layer_start = 2;          // layers [layer_start, layer_end) collect scores and evict
    int layer_end = -1;           // -1: n_layers
    int trigger_min_tokens = 512; // layers that have seen fewer tokens (tokens_seen) are left alone
    int update_interval = 32;     // decode tokens between policy updates
    bool per_head_budget = false; // share the layer's budget between its kv heads (KV-Compress)
    uint64_t seed = 0;            // for the random policy
    // Queries in the observation window of the window policies (snapkv; tova takes 1): the
    // most recent ones, e.g. the prompt's last tokens, where the question usually is.
    int observation_window = 32;
    // Shared layer budget (per_head_budget) only, AdaKV style: each head keeps at least this share
    // of the per-head budget (its floors count towards it), the rest is chosen jointly. In [0, 1];
    // 0 = no per-head minimum beyond the floors.
    double head_floor_share = 0.0;
    // How the evicting layers share the keep ratio: "uniform" (each keeps keep_ratio) or "pyramid"
    // (PyramidKV: linearly decreasing with depth, same whole-model total; see H2oState).
    std::string layer_budget = "uniform";
};

// An empty string if c is valid for a model of n_layers layers, else a message that starts with
// the name of the first bad field.
std::string h2o_config_error(const H2oConfig& c, int n_layers);

// c with layer_end = -1 replaced by n_layers. Throws std::invalid_argument with
// h2o_config_error's message if c is invalid.
H2oConfig resolved(const H2oConfig& c, int n_layers);

}  // namespace mnn_h2o
