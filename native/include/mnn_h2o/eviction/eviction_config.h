// Settings of eviction (see docs/eviction.md). Field names are the Python keyword arguments of
// KvCache.enable_eviction, so a validation message names what the caller actually passed.
#pragma once

#include <cstdint>
#include <string>

#include "mnn_h2o/config_field.h"

namespace mnn_h2o {

// One field per config key h2o.* that reaches the core, from the schema's list (config_schema.h):
// its name, C++ type, default and allowed values are the schema's (docs/config.md says what each
// does), and so are those of the C API's mnn_h2o_eviction_config and the Python binding's
// KvCache.enable_eviction. policy is a name of the registry (eviction_policy.h); layer_end -1 means
// n_layers.
//
// The budget (docs/eviction.md "Budget"): target_keep_ratio > 0 or kv_budget_bytes > 0 (at most one of
// the two), else target_lossy_ratio, which either of the others replaces (it is ignored then,
// whatever its value; in use it must be at least kInUseMin). Keep ratio: each evicting head keeps
// target_keep_ratio * tokens_seen tokens. Lossy ratio: the keep ratio of the evicting layers is
// chosen so that the whole model (all layers, the non-evicting ones keep everything) holds
// 1 / target_lossy_ratio of what every token seen would take: a quantised cache dtype pays its
// part of the ratio against f16 (q8: 32/17) and eviction the rest, none when the dtype alone
// reaches it. (Float dtypes: the ratio is eviction's alone, in the cache's own dtype.) Byte cap:
// kv_budget_bytes caps the bytes the whole model's K and V blocks take (all layers, in the cache
// dtype, so a quantised dtype fits more tokens): the evicting layers' heads share what the layers
// that keep everything leave.
struct EvictionConfig {
#define MNN_H2O_MEMBER(field, key, CType, CppType) CppType field = schema_default<schema::eviction::key, CppType>();
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_MEMBER)
#undef MNN_H2O_MEMBER
};

// An empty string if c is valid, else a message that starts with the name of the first bad
// field: each field against the schema, then the rules over several fields (the budget, the layer
// range), then, when n_layers > 0, against a model of n_layers layers (n_layers 0: the config
// alone, as config.validate asks through the binding).
std::string eviction_config_error(const EvictionConfig& c, int n_layers);

// c with layer_end = -1 replaced by n_layers. Throws std::invalid_argument with
// eviction_config_error's message if c is invalid.
EvictionConfig resolved(const EvictionConfig& c, int n_layers);

}  // namespace mnn_h2o
