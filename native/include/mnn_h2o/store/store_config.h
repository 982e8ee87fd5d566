// Settings of the KV cache's lossless store (kv_store.h, docs/kv_cache.md "Lossless store"):
// which blocks are compressed with the Gear codec, in what unit, and what happens to them.
#pragma once

#include <cstddef>

#include "mnn_h2o/cache/kv_cache_config.h"

namespace mnn_h2o {

enum class StoreMode {
    Off = 0,
    Probe,  // encode + decode + verify a sample of cold chunks; the KV is untouched
    Full,   // every cold chunk in scope, verified byte for byte; the KV stays raw
    Store,  // cold chunks are held only compressed; their raw blocks go back to the pool
};
const char* store_mode_name(StoreMode mode);  // "off", "probe", "full", "store"

// Faults to inject, for tests: each must end with the data still valid and the fallback counted.
struct StoreFaults {
    bool encode_error = false;     // every encode fails
    bool verify_mismatch = false;  // every verification finds a difference
    bool alloc_failure = false;    // raw blocks cannot be had when a chunk is dissolved
    bool worker_exception = false; // every job throws
};

struct StoreConfig {
    StoreMode mode = StoreMode::Off;
    // Scope: layers [0, front_n), plus the layers where H2O evicts (its [layer_start,
    // layer_end), none while eviction is off) when h2o_kept is set.
    int front_n = 0;
    bool h2o_kept = false;
    // Hot zones, always raw: the first hot_sink_tokens and the last hot_recent_tokens tokens a
    // head holds.
    int hot_sink_tokens = 64;
    int hot_recent_tokens = 256;
    // Tokens of one Gear frame (K and V of one kv head): a multiple of block_tokens.
    int chunk_tokens = 128;
    // Store mode, layers [0, v_dedup_layers): V rows are held once per distinct row, in a table
    // per kv head, and chunks refer to them (layer 0's V is a function of the token id alone, so
    // repeated tokens repeat its rows exactly). The chunk frames hold K only.
    int v_dedup_layers = 0;
    int async_threads = 0;  // 0: encode on the caller's thread
    int max_queue = 64;     // jobs in flight (submitted, not yet installed); more are deferred
    size_t decode_cache_bytes = size_t{8} << 20;
    bool prefetch = true;   // store mode with async_threads >= 1: decode the next layer ahead
    int zstd_level = 1;
    int probe_every = 8;    // probe mode: one chunk in every probe_every candidates
    StoreFaults faults;
};

// Throws std::invalid_argument "enable_store: <field> ..." for a value that is out of range for
// this cache.
void validate_store_config(const StoreConfig& config, const KvCacheConfig& cache);

}  // namespace mnn_h2o
