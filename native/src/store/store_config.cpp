#include "mnn_h2o/store/store_config.h"

#include <stdexcept>
#include <string>

namespace mnn_h2o {

const char* store_mode_name(StoreMode mode) {
    switch (mode) {
        case StoreMode::Off: return "off";
        case StoreMode::Probe: return "probe";
        case StoreMode::Full: return "full";
        case StoreMode::Store: return "store";
    }
    return "?";
}

namespace {

void require(bool ok, const char* field, const std::string& rule) {
    if (!ok) throw std::invalid_argument(std::string("enable_store: ") + field + " " + rule);
}

}  // namespace

void validate_store_config(const StoreConfig& c, const KvCacheConfig& cache) {
    require(c.mode == StoreMode::Off || c.mode == StoreMode::Probe || c.mode == StoreMode::Full ||
                c.mode == StoreMode::Store,
            "mode", "must be off, probe, full or store");
    // Gear's element types are the float ones: it models the exponent and mantissa bytes of
    // fp16/bf16/fp32, which integer codes do not have (docs/gear_format.md).
    if (c.mode != StoreMode::Off && kv_dtype_quantised(cache.dtype))
        throw std::invalid_argument(std::string("enable_store: the lossless store does not take the quantised KV dtype ") +
                                    kv_dtype_name(cache.dtype) + " (use f16, bf16 or f32, or mode off)");
    require(c.front_n >= 0 && c.front_n <= cache.n_layers, "front_n",
            "must be in [0, n_layers=" + std::to_string(cache.n_layers) + "]");
    require(c.hot_sink_tokens >= 0, "hot_sink_tokens", "must be >= 0");
    require(c.hot_recent_tokens >= 0, "hot_recent_tokens", "must be >= 0");
    require(c.chunk_tokens >= cache.block_tokens && c.chunk_tokens % cache.block_tokens == 0 &&
                c.chunk_tokens <= 65536,
            "chunk_tokens", "must be a multiple of block_tokens=" + std::to_string(cache.block_tokens) + " up to 65536");
    require(c.async_threads >= 0 && c.async_threads <= 64, "async_threads", "must be in [0, 64]");
    require(c.max_queue >= 1, "max_queue", "must be >= 1");
    require(c.zstd_level >= 1 && c.zstd_level <= 19, "zstd_level", "must be in [1, 19]");
    require(c.probe_every >= 1, "probe_every", "must be >= 1");
    require(c.v_dedup_layers >= 0 && c.v_dedup_layers <= cache.n_layers, "v_dedup_layers",
            "must be in [0, n_layers=" + std::to_string(cache.n_layers) + "]");
}

}  // namespace mnn_h2o
