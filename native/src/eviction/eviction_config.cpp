#include "mnn_h2o/eviction/eviction_config.h"

#include <stdexcept>

namespace mnn_h2o {

namespace {

namespace key = schema::eviction;

template <class T>
std::string num(T x) {
    return value_text(x);
}

}  // namespace

std::string eviction_config_error(const EvictionConfig& c, int n_layers) {
    // Each field against the schema, in its order; the first bad one is named.
#define MNN_H2O_CHECK(field, key, CType, CppType) \
    if (std::string e = field_error<schema::eviction::key>(#field, c.field); !e.empty()) return e;
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_CHECK)
#undef MNN_H2O_CHECK
    // The budget (docs/eviction.md "Budget"): a keep ratio or a byte cap, at most one, replaces the
    // lossy ratio, which is otherwise the target and then a real ratio.
    if (c.target_keep_ratio > 0.0 && c.kv_budget_bytes > 0)
        return "target_keep_ratio and kv_budget_bytes: set at most one, got " + num(c.target_keep_ratio) + " and " +
               num(c.kv_budget_bytes);
    if (c.target_keep_ratio == 0.0 && c.kv_budget_bytes == 0 && c.target_lossy_ratio < key::target_lossy_ratio::kInUseMin)
        return "target_lossy_ratio must be >= " + num(key::target_lossy_ratio::kInUseMin) +
               " when target_keep_ratio and kv_budget_bytes are 0, got " + num(c.target_lossy_ratio);
    if (c.layer_end != -1 && c.layer_end <= c.layer_start)
        return "layer_end must be -1 (all layers) or > layer_start (" + num(c.layer_start) + "), got " + num(c.layer_end);
    // The model's own bounds.
    if (n_layers > 0 && c.layer_start >= n_layers)
        return "layer_start must be below n_layers=" + num(n_layers) + ", got " + num(c.layer_start);
    if (n_layers > 0 && c.layer_end > n_layers)
        return "layer_end must be -1 (all layers) or at most n_layers=" + num(n_layers) + ", got " + num(c.layer_end);
    return {};
}

EvictionConfig resolved(const EvictionConfig& c, int n_layers) {
    const std::string error = eviction_config_error(c, n_layers);
    if (!error.empty()) throw std::invalid_argument("enable_eviction: " + error);
    EvictionConfig r = c;
    if (r.layer_end == -1) r.layer_end = n_layers;
    return r;
}

}  // namespace mnn_h2o
