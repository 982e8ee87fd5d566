#include "mnn_h2o/store/store_config.h"

#include <stdexcept>
#include <string>

namespace mnn_h2o {

const char* store_mode_name(StoreMode mode) {
    const char* name = enum_name(mode);
    return name ? name : "?";
}

const char* store_scope_name(StoreScope scope) {
    const char* name = enum_name(scope);
    return name ? name : "?";
}

std::string store_config_error(const StoreConfig& c, const KvCacheConfig& cache) {
    // Each field against the schema, in its order; the first bad one is named.
#define MNN_H2O_CHECK(field, key, CType, CppType) \
    if (std::string e = field_error<schema::lossless::key>(#field, c.field); !e.empty()) return e;
    MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_CHECK)
#undef MNN_H2O_CHECK
    // Then the cache's own bounds.
    if (cache.block_tokens <= 0 || c.chunk_tokens % cache.block_tokens != 0)
        return "chunk_tokens must be a multiple of block_tokens (" + std::to_string(cache.block_tokens) + "), got " +
               std::to_string(c.chunk_tokens);
    if (cache.n_layers > 0 && c.front_n > cache.n_layers)
        return "front_n must be at most n_layers=" + std::to_string(cache.n_layers) + ", got " + std::to_string(c.front_n);
    if (cache.n_layers > 0 && c.v_dedup_layers > cache.n_layers)
        return "v_dedup_layers must be at most n_layers=" + std::to_string(cache.n_layers) + ", got " +
               std::to_string(c.v_dedup_layers);
    return {};
}

void validate_store_config(const StoreConfig& c, const KvCacheConfig& cache) {
    const std::string error = store_config_error(c, cache);
    if (!error.empty()) throw std::invalid_argument("enable_store: " + error);
}

}  // namespace mnn_h2o
