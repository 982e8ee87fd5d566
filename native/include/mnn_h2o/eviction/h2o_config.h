// Settings of H2O eviction (see docs/h2o.md). Field names are the Python keyword arguments of
// KvCache.enable_h2o, so a validation message names what the caller actually passed.
#pragma once

#include <cstdint>
#include <string>

#include "mnn_h2o/config_schema.h"

namespace mnn_h2o {

// Each field is the config key h2o.<field> (docs/config.md): its default here and its bounds in
// h2o_config_error() are the schema's, from the generated config_schema.h, so this struct, the C
// API's mnn_h2o_eviction_config_init and the Python binding's defaults are config.py's.
struct H2oConfig {
    std::string policy{schema::h2o::policy::kDefault};  // a name of the registry (policy_list(), eviction_policy.h)
    int sink_tokens{schema::h2o::sink_tokens::kDefault};      // the blocks covering the first sink_tokens tokens are never evicted
    int recent_tokens{schema::h2o::recent_tokens::kDefault};  // nor those covering the last recent_tokens (the newest token stays)
    // The sink and recent floors take at most this share of a head's budget: beyond
    // it both shrink in proportion (the recent floor to no less than the newest block), so a
    // budget smaller than the floors is still met. 0 = never shrink: a head whose floors exceed
    // its budget is left alone (skipped as floors_exceed_target).
    double max_floor_share{schema::h2o::max_floor_share::kDefault};
    // Budget: target_keep_ratio > 0 or kv_budget_bytes > 0 (at most one of the two), else
    // target_lossy_ratio, which either of the others replaces (it is ignored then, whatever its
    // value; in use it must be at least kInUseMin). Keep ratio: each evicting head keeps target_keep_ratio * tokens_seen tokens. Lossy ratio: the
    // keep ratio of the evicting layers is chosen so that the whole model (all layers, the
    // non-evicting ones keep everything) holds 1 / target_lossy_ratio of what every token seen
    // would take: a quantised cache dtype pays its part of the ratio against f16 (q8: 32/17) and
    // eviction the rest, none when the dtype alone reaches it. (Float dtypes: the ratio is
    // eviction's alone, in the cache's own dtype.) Byte cap: kv_budget_bytes caps the bytes the
    // whole model's K and V blocks take (all layers, in the cache dtype, so a quantised dtype fits
    // more tokens): the evicting layers' heads share what the layers that keep everything leave.
    double target_keep_ratio{schema::h2o::target_keep_ratio::kDefault};
    double target_lossy_ratio{schema::h2o::target_lossy_ratio::kDefault};
    int64_t kv_budget_bytes{schema::h2o::kv_budget_bytes::kDefault};
    double ema_alpha{schema::h2o::ema_alpha::kDefault};       // weight of the old score at each update
    int layer_start{schema::h2o::layer_start::kDefault};      // layers [layer_start, layer_end) collect scores and evict
    int layer_end{schema::h2o::layer_end::kDefault};          // -1: n_layers
    int trigger_min_tokens{schema::h2o::trigger_min_tokens::kDefault};  // layers that have seen fewer tokens (tokens_seen) are left alone
    int update_interval{schema::h2o::update_interval::kDefault};        // decode tokens between policy updates
    bool per_head_budget{schema::h2o::per_head_budget::kDefault};       // share the layer's budget between its kv heads (KV-Compress)
    uint64_t seed{schema::h2o::seed::kDefault};               // for the random policy
    // Queries in the observation window of the window policies (snapkv; tova takes 1): the
    // most recent ones, e.g. the prompt's last tokens, where the question usually is.
    int observation_window{schema::h2o::observation_window::kDefault};
    // Shared layer budget (per_head_budget) only, AdaKV style: each head keeps at least this share
    // of the per-head budget (its floors count towards it), the rest is chosen jointly; 0 = no
    // per-head minimum beyond the floors.
    double head_floor_share{schema::h2o::head_floor_share::kDefault};
    // How the evicting layers share the keep ratio: "uniform" (each keeps keep_ratio) or "pyramid"
    // (PyramidKV: linearly decreasing with depth, same whole-model total; see H2oState).
    std::string layer_budget{schema::h2o::layer_budget::kDefault};
};

// An empty string if c is valid for a model of n_layers layers, else a message that starts with
// the name of the first bad field.
std::string h2o_config_error(const H2oConfig& c, int n_layers);

// c with layer_end = -1 replaced by n_layers. Throws std::invalid_argument with
// h2o_config_error's message if c is invalid.
H2oConfig resolved(const H2oConfig& c, int n_layers);

}  // namespace mnn_h2o
