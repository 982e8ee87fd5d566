#include "mnn_h2o/eviction/h2o_config.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "mnn_h2o/eviction/eviction_policy.h"

namespace mnn_h2o {

namespace {

std::string got(double x) {
    std::ostringstream s;
    s << x;
    return ", got " + s.str();
}

}  // namespace

std::string h2o_config_error(const H2oConfig& c, int n_layers) {
    if (!is_policy_name(c.policy)) return "policy must be " + std::string(policy_names()) + ", got '" + c.policy + "'";
    if (c.sink_tokens < 0) return "sink_tokens must be >= 0" + got(c.sink_tokens);
    // The recent floor is what guarantees that every plan keeps the newest token.
    if (c.recent_tokens < 1) return "recent_tokens must be >= 1" + got(c.recent_tokens);
    if (!(c.max_floor_share >= 0.0 && c.max_floor_share <= 1.0))
        return "max_floor_share must be in [0, 1] (0 = never shrink the floors)" + got(c.max_floor_share);
    if (!(std::isfinite(c.target_keep_ratio) && c.target_keep_ratio >= 0.0 && c.target_keep_ratio <= 1.0))
        return "target_keep_ratio must be in [0, 1] (0 = use target_lossy_ratio)" + got(c.target_keep_ratio);
    if (!(std::isfinite(c.target_lossy_ratio) && (c.target_lossy_ratio == 0.0 || c.target_lossy_ratio >= 1.0)))
        return "target_lossy_ratio must be 0 (use target_keep_ratio) or >= 1" + got(c.target_lossy_ratio);
    if (c.kv_budget_bytes < 0) return "kv_budget_bytes must be >= 0 (0 = a ratio target)" + got(static_cast<double>(c.kv_budget_bytes));
    if ((c.target_keep_ratio > 0.0) + (c.target_lossy_ratio > 0.0) + (c.kv_budget_bytes > 0) != 1)
        return "target_keep_ratio, target_lossy_ratio and kv_budget_bytes: exactly one must be > 0, got " +
               std::to_string(c.target_keep_ratio) + ", " + std::to_string(c.target_lossy_ratio) + " and " +
               std::to_string(c.kv_budget_bytes);
    if (!(c.ema_alpha >= 0.0 && c.ema_alpha < 1.0)) return "ema_alpha must be in [0, 1)" + got(c.ema_alpha);
    if (c.layer_start < 0 || c.layer_start >= n_layers)
        return "layer_start must be in [0, " + std::to_string(n_layers) + ")" + got(c.layer_start);
    if (c.layer_end != -1 && (c.layer_end <= c.layer_start || c.layer_end > n_layers))
        return "layer_end must be -1 (all layers) or in (layer_start, " + std::to_string(n_layers) + "]" +
               got(c.layer_end);
    if (c.trigger_min_tokens < 0) return "trigger_min_tokens must be >= 0" + got(c.trigger_min_tokens);
    if (c.update_interval < 1) return "update_interval must be >= 1" + got(c.update_interval);
    if (c.observation_window < 1) return "observation_window must be >= 1" + got(c.observation_window);
    if (!(c.head_floor_share >= 0.0 && c.head_floor_share <= 1.0))
        return "head_floor_share must be in [0, 1]" + got(c.head_floor_share);
    if (c.layer_budget != "uniform" && c.layer_budget != "pyramid")
        return "layer_budget must be 'uniform' or 'pyramid', got '" + c.layer_budget + "'";
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
