#include "mnn_h2o/eviction/h2o_config.h"

#include <sstream>
#include <stdexcept>

#include "mnn_h2o/eviction/eviction_policy.h"

namespace mnn_h2o {

namespace {

namespace key = schema::h2o;

std::string num(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

std::string got(double x) { return ", got " + num(x); }

// "" if x is within K's schema bounds, else "<name> must be in [lo, hi], got x".
template <class K, class T>
std::string bounds_error(T x) {
    return schema::in_bounds<K>(x) ? std::string() : std::string(K::kName) + " must be " + K::kAllowed + got(static_cast<double>(x));
}

}  // namespace

std::string h2o_config_error(const H2oConfig& c, int n_layers) {
    if (!is_policy_name(c.policy)) return "policy must be " + std::string(policy_names()) + ", got '" + c.policy + "'";
    // The bounds of every number are the schema's (config_schema.h); the first bad field is named.
    for (const std::string& e : {bounds_error<key::sink_tokens>(c.sink_tokens),
                                 bounds_error<key::recent_tokens>(c.recent_tokens),
                                 bounds_error<key::max_floor_share>(c.max_floor_share),
                                 bounds_error<key::target_keep_ratio>(c.target_keep_ratio),
                                 bounds_error<key::target_lossy_ratio>(c.target_lossy_ratio),
                                 bounds_error<key::kv_budget_bytes>(c.kv_budget_bytes),
                                 bounds_error<key::ema_alpha>(c.ema_alpha),
                                 bounds_error<key::layer_start>(c.layer_start),
                                 bounds_error<key::layer_end>(c.layer_end),
                                 bounds_error<key::trigger_min_tokens>(c.trigger_min_tokens),
                                 bounds_error<key::update_interval>(c.update_interval),
                                 bounds_error<key::seed>(c.seed),
                                 bounds_error<key::observation_window>(c.observation_window),
                                 bounds_error<key::head_floor_share>(c.head_floor_share)})
        if (!e.empty()) return e;
    // The budget (docs/h2o.md "Budget"): a keep ratio or a byte cap, at most one, replaces the
    // lossy ratio, which is otherwise the target and then a real ratio.
    if (c.target_keep_ratio > 0.0 && c.kv_budget_bytes > 0)
        return "target_keep_ratio and kv_budget_bytes: set at most one, got " + std::to_string(c.target_keep_ratio) +
               " and " + std::to_string(c.kv_budget_bytes);
    if (c.target_keep_ratio == 0.0 && c.kv_budget_bytes == 0 && c.target_lossy_ratio < key::target_lossy_ratio::kInUseMin)
        return "target_lossy_ratio must be >= " + num(key::target_lossy_ratio::kInUseMin) +
               " when target_keep_ratio and kv_budget_bytes are 0" + got(c.target_lossy_ratio);
    // The model's own bounds.
    if (c.layer_start >= n_layers)
        return "layer_start must be below n_layers=" + std::to_string(n_layers) + got(c.layer_start);
    if (c.layer_end != -1 && (c.layer_end <= c.layer_start || c.layer_end > n_layers))
        return "layer_end must be -1 (all layers) or in (layer_start, " + std::to_string(n_layers) + "]" +
               got(c.layer_end);
    if (schema::choice_index<key::layer_budget>(c.layer_budget) < 0)
        return std::string("layer_budget must be ") + key::layer_budget::kAllowed + ", got '" + c.layer_budget + "'";
    return {};
}

H2oConfig resolved(const H2oConfig& c, int n_layers) {
    const std::string error = h2o_config_error(c, n_layers);
    if (!error.empty()) throw std::invalid_argument("enable_h2o: " + error);
    H2oConfig r = c;
    if (r.layer_end == -1) r.layer_end = n_layers;
    return r;
}

}  // namespace mnn_h2o
