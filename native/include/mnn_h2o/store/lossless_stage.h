// The lossless stage of a KvCache, whichever lossless.mode runs it (docs/kv_cache.md "Lossless
// store"): cold blocks of the layers in scope are Gear-encoded a chunk at a time (K and V of one kv
// head, chunk_tokens tokens, one frame). Every mode runs the same path, schedule -> encode ->
// verify; probe and full measure the frames and throw them away, store installs them in place of
// the raw blocks, which go back to the pool, and attention reads them through a decode cache.
//
// KvCache owns one while the store is enabled and calls into it at safe points on its own
// thread: step/attend (install finished jobs, resolve compressed chunks, prefetch), end_step
// (schedule new chunks), evict/truncate (dissolve affected chunks) and reset. The parts, each in
// its own file: chunk_codec.h (frames), chunk_table.h (the chunks per head: install, re-encode,
// merge, dissolve), head_v_rows.h (V row tables), decode_cache.h (attention and read() over
// frames, prefetch), store_jobs.h (the workers' jobs), store_stats.h (counters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/store/chunk_table.h"
#include "mnn_h2o/store/decode_cache.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/eviction/eviction_config.h"
#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/cache/kv_head_blocks.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/store/store_jobs.h"
#include "mnn_h2o/store/store_stats.h"
#include "mnn_h2o/runtime/team.h"

namespace mnn_h2o {

class LosslessStage {
public:
    // heads is the cache's [layer][kv head] block lists; pool the pool their blocks come from.
    // config must have been validated for cache, its mode not off.
    LosslessStage(const StoreConfig& config, const KvCacheConfig& cache, BlockPool& pool, std::vector<KvHeadBlocks>& heads);
    ~LosslessStage();  // cancels queued jobs and joins the workers
    LosslessStage(const LosslessStage&) = delete;
    LosslessStage& operator=(const LosslessStage&) = delete;

    const StoreConfig& config() const { return cfg_; }

    // Safe point: installs the jobs that have finished.
    void install_finished();
    // Makes (or queues) the frames of the cold chunks of every layer in scope. eviction: the active
    // eviction config (its layers are in scope with the kept scopes), or null.
    void schedule(const EvictionConfig* eviction);
    // Waits for every job and installs it.
    void drain();

    bool holds_compressed(int layer) const { return table_.holds_compressed(layer); }
    // The attention of problem (all heads of layer, as KvCache would run it) with compressed
    // chunks resolved through the decode cache, one kv head at a time; bit-identical results.
    void attend(int layer, const AttentionProblem& problem, Isa isa, Team* pool, AttentionWorkspace& ws) {
        cache_.attend(layer, problem, isa, pool, ws);
    }
    // Starts decoding layer's compressed chunks that are not cached into the cache (workers).
    void prefetch(int layer) { cache_.prefetch(layer); }

    // Before the cache compacts a head by a valid plan: chunks losing blocks are dissolved
    // (survivors get raw blocks again), the rest follow their blocks. Throws std::bad_alloc for
    // a plan that is not block-aligned when raw blocks cannot be had (nothing is lost).
    void compact(int layer, int head, const std::vector<TokenRun>& runs, bool block_aligned);
    // Before the cache keeps only the first n_tokens of a head. Throws std::bad_alloc if a
    // chunk across the cut cannot be dissolved (the head is unchanged then).
    void truncate(int layer, int head, int n_tokens);
    // Everything back to raw blocks (disabling or replacing the store). Throws std::bad_alloc
    // when raw blocks cannot be had; what could not be dissolved stays compressed and valid.
    void dissolve_all();
    // Drops every frame, cache entry, scratch buffer and job, and zeroes the counters (the cache
    // is being emptied).
    void reset();

    // K and V rows (cache dtype) of block `block` of a head, which must be compressed; valid
    // until the next call into the store.
    void read_block(int layer, int head, int block, const void** k, const void** v) {
        cache_.read_block(layer, head, block, k, v);
    }

    // Frames + V row tables + decode cache + scratch + job copies.
    size_t bytes_held() const;
    StoreStats stats() const;

private:
    // What a mode makes of the one path. The modes differ only here, decided once: probe samples
    // candidates and skips the check of the live blocks, and only store keeps frames (and so
    // dedups V rows, which would change what probe and full measure).
    struct ModePlan {
        explicit ModePlan(const StoreConfig& c);
        int sample_every;    // one candidate chunk in this many is encoded
        bool check_blocks;   // the blocks must still hash to what was encoded
        bool keeps_frames;   // frames replace the raw blocks
        int v_dedup_layers;  // layers whose frames hold K and refer to V rows
    };

    bool in_scope(int layer, const EvictionConfig* eviction) const;
    void schedule_head(int layer, int head);
    void submit(int layer, int head, int first, int n_blocks);
    void install(store::Job& job, bool failed);

    const StoreConfig cfg_;
    const ModePlan plan_;
    const int n_layers_, n_kv_heads_, block_tokens_, blocks_per_chunk_;
    const store::ChunkCodec codec_;
    std::vector<StoreLayerStats> layer_stats_;  // [layer]
    int64_t deferrals_ = 0, stale_jobs_ = 0, candidates_ = 0;
    // The caller's thread's codec and buffers: encoding without workers, the checks on install,
    // re-encoding, decoding for attention's thread 0 and read().
    store::EncodeBuffers own_;
    store::ChunkTable table_;
    store::DecodeCache cache_;
    store::StoreJobs jobs_;  // last: its workers are joined before the chunks their jobs read go
};

}  // namespace mnn_h2o
