// Settings of the KV cache's lossless store (kv_store.h, docs/kv_cache.md "Lossless store"):
// which blocks are compressed with the Gear codec, in what unit, and what happens to them.
#pragma once

#include <cstddef>

#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/config_schema.h"

namespace mnn_h2o {

enum class StoreMode {
    Off = 0,
    Probe,  // encode + decode + verify a sample of cold chunks; the KV is untouched
    Full,   // every cold chunk in scope, verified byte for byte; the KV stays raw
    Store,  // cold chunks are held only compressed; their raw blocks go back to the pool
};
const char* store_mode_name(StoreMode mode);  // "off", "probe", "full", "store"

// Which layers' cold blocks are compressed.
enum class StoreScope {
    FrontN = 0,         // layers [0, front_n)
    H2oKept,            // the layers where H2O evicts (its [layer_start, layer_end); none while it is off)
    FrontNAndH2oKept,   // both
};
const char* store_scope_name(StoreScope scope);  // "front_n", "h2o_kept", "front_n_and_h2o_kept"

// The enums in the schema's order of lossless.mode and lossless.scope choices (config_schema.h).
static_assert(static_cast<int>(StoreMode::Store) + 1 == schema::lossless::mode::kChoiceCount, "lossless.mode");
static_assert(static_cast<int>(StoreScope::FrontNAndH2oKept) + 1 == schema::lossless::scope::kChoiceCount,
              "lossless.scope");

// Faults to inject, for tests: each must end with the data still valid and the fallback counted.
struct StoreFaults {
    bool encode_error = false;     // every encode fails
    bool verify_mismatch = false;  // every verification finds a difference
    bool alloc_failure = false;    // raw blocks cannot be had when a chunk is dissolved
    bool worker_exception = false; // every job throws
};

// Each field but faults is the config key lossless.<field> (docs/config.md): its default here and its
// bounds in validate_store_config() are the schema's, from the generated config_schema.h.
struct StoreConfig {
    StoreMode mode{static_cast<StoreMode>(schema::lossless::mode::kDefaultIndex)};
    StoreScope scope{static_cast<StoreScope>(schema::lossless::scope::kDefaultIndex)};
    int front_n{schema::lossless::front_n::kDefault};  // the front_n scope: layers [0, front_n)
    // Hot zones, always raw: the first hot_sink_tokens and the last hot_recent_tokens tokens a
    // head holds.
    int hot_sink_tokens{schema::lossless::hot_sink_tokens::kDefault};
    int hot_recent_tokens{schema::lossless::hot_recent_tokens::kDefault};
    // Tokens of one Gear frame (K and V of one kv head): a multiple of block_tokens.
    int chunk_tokens{schema::lossless::chunk_tokens::kDefault};
    // Store mode, layers [0, v_dedup_layers): V rows are held once per distinct row, in a table
    // per kv head, and chunks refer to them (layer 0's V is a function of the token id alone, so
    // repeated tokens repeat its rows exactly). The chunk frames hold K only.
    int v_dedup_layers{schema::lossless::v_dedup_layers::kDefault};
    int async_threads{schema::lossless::async_threads::kDefault};  // 0: encode on the caller's thread
    int max_queue{schema::lossless::max_queue::kDefault};  // jobs in flight (submitted, not yet installed); more are deferred
    size_t decode_cache_bytes{schema::lossless::decode_cache_bytes::kDefault};
    bool prefetch{schema::lossless::prefetch::kDefault};   // store mode with async_threads >= 1: decode the next layer ahead
    int zstd_level{schema::lossless::zstd_level::kDefault};
    int probe_every{schema::lossless::probe_every::kDefault};  // probe mode: one chunk in every probe_every candidates
    StoreFaults faults;

    // The layer scope holds layers [0, front_n) / H2O's layers.
    bool front_n_scope() const { return scope != StoreScope::H2oKept; }
    bool h2o_kept_scope() const { return scope != StoreScope::FrontN; }
};

// Throws std::invalid_argument "enable_store: <field> ..." for a value that is out of range for
// this cache.
void validate_store_config(const StoreConfig& config, const KvCacheConfig& cache);

}  // namespace mnn_h2o
