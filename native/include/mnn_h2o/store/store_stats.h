// What the lossless store counts (docs/kv_cache.md "Accounting"): per-layer counters, the
// reasons a chunk stayed raw, and the snapshot LosslessStage::stats() returns.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mnn_h2o/store/store_config.h"

namespace mnn_h2o {

// Why a cold chunk stayed raw.
enum class StoreFallback { Incompressible = 0, EncodeError, VerifyMismatch, AllocFailure, WorkerException };
constexpr int kStoreFallbacks = 5;
const char* store_fallback_name(StoreFallback reason);  // "incompressible", "encode_error", ...

// Counters of one layer since the store was enabled or the cache reset.
struct StoreLayerStats {
    int64_t chunks_encoded = 0;    // frames made (every mode)
    int64_t chunks_stored = 0;     // frames that replaced raw blocks (store mode)
    int64_t raw_bytes = 0;         // raw bytes of the encoded chunks
    int64_t compressed_bytes = 0;  // their frame bytes
    int64_t stored_raw_bytes = 0;  // raw bytes of the stored chunks
    int64_t stored_blob_bytes = 0; // their frame bytes
    double encode_us = 0.0;        // encoding (on whichever thread ran it)
    double verify_us = 0.0;        // the decode that checks each new frame
    double decode_us = 0.0;        // decodes for attention, read() and dissolving
    int64_t verify_mismatches = 0; // frames whose decode differed from the raw bytes
    int64_t cache_hits = 0, cache_misses = 0;  // compressed chunks resolved for attention
    int64_t decode_batches = 0;    // parallel decodes of the misses (each wakes the threads)
    int64_t dissolved = 0;         // chunks turned back into raw blocks
    int64_t repacked = 0;          // chunks re-encoded without the blocks H2O evicted
    int64_t merged = 0;            // pairs of trimmed neighbouring chunks re-encoded as one
    std::array<int64_t, kStoreFallbacks> fallbacks{};

    void count(StoreFallback reason) { ++fallbacks[static_cast<int>(reason)]; }
    StoreLayerStats& operator+=(const StoreLayerStats& other);
};

struct StoreStats {
    struct Layer {
        StoreLayerStats counters;
        int64_t chunks_held = 0;  // compressed chunks now
        size_t blob_bytes = 0;    // their frames (capacity)
        size_t table_bytes = 0;   // V dedup layers: the distinct V rows (row_table.h)
        size_t held_raw_bytes = 0;  // the live blocks of the chunks held, at raw size
    };
    StoreMode mode = StoreMode::Off;
    std::vector<Layer> layers;
    StoreLayerStats total;          // the layers' counters summed
    double lossless_ratio = 1.0;    // store: held_raw_bytes / (blob_bytes + table_bytes), the chunks
                                    // held now; probe, full: raw / compressed of everything encoded
    double async_wait_us = 0.0;     // the caller waiting for workers (prefetches, drain)
    int queue_peak = 0;             // most jobs in flight at once
    int64_t deferrals = 0;          // chunks left raw for a later end_step because the queue was full
    int64_t stale_jobs = 0;         // finished jobs whose blocks had moved meanwhile (dropped)
    int64_t chunks_held = 0;
    size_t blob_bytes = 0;          // frames held (capacity)
    size_t table_bytes = 0;         // V row tables of the dedup layers
    size_t held_raw_bytes = 0;      // the live blocks of the chunks held, at raw size
    size_t cache_bytes = 0;         // decode cache (including prefetches under way)
    size_t scratch_bytes = 0;       // decode scratch and job copies
    // Filled by KvCache::store_stats(): the whole cache.
    size_t pool_bytes = 0;          // raw blocks (KvCache::pool_bytes_held())
    size_t bytes_held = 0;          // pool + blobs + cache + scratch (KvCache::bytes_held())
    size_t bytes_uncompressed = 0;  // as EvictionStats::bytes_uncompressed
    double total_ratio = 1.0;       // bytes_uncompressed / bytes_held
};

}  // namespace mnn_h2o
