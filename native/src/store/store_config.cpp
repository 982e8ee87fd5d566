#include "mnn_h2o/store/store_config.h"

#include <stdexcept>
#include <string>

namespace mnn_h2o {

// The names are the schema's choices (the enums follow their order: store_config.h).
const char* store_mode_name(StoreMode mode) {
    const int i = static_cast<int>(mode);
    return i >= 0 && i < schema::lossless::mode::kChoiceCount ? schema::lossless::mode::kChoices[i] : "?";
}

const char* store_scope_name(StoreScope scope) {
    const int i = static_cast<int>(scope);
    return i >= 0 && i < schema::lossless::scope::kChoiceCount ? schema::lossless::scope::kChoices[i] : "?";
}

namespace {

namespace key = schema::lossless;

void require(bool ok, const char* field, const std::string& rule) {
    if (!ok) throw std::invalid_argument(std::string("enable_store: ") + field + " " + rule);
}

// x within K's schema bounds (config_schema.h).
template <class K, class T>
void require_bounds(T x) {
    require(schema::in_bounds<K>(x), K::kName, std::string("must be ") + K::kAllowed + ", got " + std::to_string(x));
}

}  // namespace

void validate_store_config(const StoreConfig& c, const KvCacheConfig& cache) {
    require(c.mode == StoreMode::Off || c.mode == StoreMode::Probe || c.mode == StoreMode::Full ||
                c.mode == StoreMode::Store,
            "mode", std::string("must be ") + key::mode::kAllowed);
    require(c.scope == StoreScope::FrontN || c.scope == StoreScope::H2oKept || c.scope == StoreScope::FrontNAndH2oKept,
            "scope", std::string("must be ") + key::scope::kAllowed);
    // The bounds of every number are the schema's; then the cache's own.
    require_bounds<key::front_n>(c.front_n);
    require_bounds<key::hot_sink_tokens>(c.hot_sink_tokens);
    require_bounds<key::hot_recent_tokens>(c.hot_recent_tokens);
    require_bounds<key::chunk_tokens>(c.chunk_tokens);
    require_bounds<key::v_dedup_layers>(c.v_dedup_layers);
    require_bounds<key::async_threads>(c.async_threads);
    require_bounds<key::max_queue>(c.max_queue);
    require_bounds<key::decode_cache_bytes>(c.decode_cache_bytes);
    require_bounds<key::zstd_level>(c.zstd_level);
    require_bounds<key::probe_every>(c.probe_every);
    require(c.front_n <= cache.n_layers, "front_n", "must be at most n_layers=" + std::to_string(cache.n_layers));
    require(c.chunk_tokens % cache.block_tokens == 0, "chunk_tokens",
            "must be a multiple of block_tokens=" + std::to_string(cache.block_tokens));
    require(c.v_dedup_layers <= cache.n_layers, "v_dedup_layers",
            "must be at most n_layers=" + std::to_string(cache.n_layers));
}

}  // namespace mnn_h2o
