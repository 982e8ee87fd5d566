// The lossless store of a KvCache (docs/kv_cache.md "Lossless store"): cold blocks of the layers
// in scope are Gear-encoded a chunk at a time (K and V of one kv head, chunk_tokens tokens, one
// frame). Depending on the mode the frames are only measured (probe, full) or replace the raw
// blocks (store), which then go back to the pool; attention reads them through a decode cache.
//
// KvCache owns one while the store is enabled and calls into it at safe points on its own
// thread: step/attend (install finished jobs, resolve compressed chunks, prefetch), end_step
// (schedule new chunks), evict/truncate (dissolve affected chunks) and reset. Workers
// (work_queue.h) only ever see their job's private copy of the data and, for prefetches, a frame
// that stays alive and unchanged until the job is settled.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mnn_h2o/attention.h"
#include "mnn_h2o/block_pool.h"
#include "mnn_h2o/eviction_policy.h"
#include "mnn_h2o/gear_codec.h"
#include "mnn_h2o/h2o_config.h"
#include "mnn_h2o/kv_cache_config.h"
#include "mnn_h2o/kv_head_blocks.h"
#include "mnn_h2o/row_table.h"
#include "mnn_h2o/store_config.h"
#include "mnn_h2o/thread_pool.h"
#include "mnn_h2o/work_queue.h"

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
    size_t bytes_uncompressed = 0;  // as H2oStats::bytes_uncompressed
    double total_ratio = 1.0;       // bytes_uncompressed / bytes_held
};

class KvStore {
public:
    // heads is the cache's [layer][kv head] block lists; pool the pool their blocks come from.
    // config must have been validated for cache.
    KvStore(const StoreConfig& config, const KvCacheConfig& cache, BlockPool& pool, std::vector<KvHeadBlocks>& heads);
    ~KvStore();  // cancels queued jobs and joins the workers
    KvStore(const KvStore&) = delete;
    KvStore& operator=(const KvStore&) = delete;

    const StoreConfig& config() const { return cfg_; }

    // Safe point: installs the jobs that have finished.
    void install_finished();
    // Makes (or queues) the frames of the cold chunks of every layer in scope. h2o: the active
    // eviction config (its layers are in scope with h2o_kept), or null.
    void schedule(const H2oConfig* h2o);
    // Waits for every job and installs it.
    void drain();

    bool holds_compressed(int layer) const { return stored_chunks_[layer] > 0; }
    // The attention of problem (all heads of layer, as KvCache would run it) with compressed
    // chunks resolved through the decode cache, one kv head at a time; bit-identical results.
    void attend(int layer, const AttentionProblem& problem, Isa isa, ThreadPool* pool, AttentionWorkspace& ws);
    // Starts decoding layer's compressed chunks that are not cached into the cache (workers).
    void prefetch(int layer);

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
    void read_block(int layer, int head, int block, const void** k, const void** v);

    // Frames + V row tables + decode cache + scratch + job copies.
    size_t bytes_held() const;
    StoreStats stats() const;

private:
    struct Chunk;
    struct Job;
    struct EncodeBuffers;
    struct HeadState;
    struct AlignedBytes;

    HeadState& state(int layer, int head);
    KvHeadBlocks& blocks(int layer, int head) { return heads_[static_cast<size_t>(layer) * n_kv_heads_ + head]; }
    bool in_scope(int layer, const H2oConfig* h2o) const;
    bool dedup_layer(int layer) const { return cfg_.mode == StoreMode::Store && layer < cfg_.v_dedup_layers; }
    gear::Shape chunk_shape(int n_blocks, bool k_only) const;
    size_t chunk_raw_bytes(int n_blocks) const { return 2 * static_cast<size_t>(n_blocks) * block_bytes_; }

    void schedule_head(int layer, int head);
    void submit(int layer, int head, int first, int n_blocks);
    struct Encoded {
        bool encoded = false, verified = false;
        size_t size = 0;  // frame bytes in the buffers' frame
        double encode_us = 0.0, verify_us = 0.0;
    };
    Encoded encode_checked(EncodeBuffers& buffers, int n_blocks, bool k_only) const;
    void run_encode(Job& job, EncodeBuffers& buffers) const;
    void settle_encodes(int layer, int head);
    void process(const WorkQueue::Completion& done);
    void install(Job& job, bool failed);
    void fallback(int layer, StoreFallback reason) { ++layer_stats_[layer].fallbacks[static_cast<int>(reason)]; }

    // attend(): points the views of the chunks that keys [key_begin, key_end) of a head touch at
    // their decoded bytes, [2][n_blocks][block] (K then V): a cache entry, a new one if the budget
    // has room, else scratch.
    void prepare_keys(int layer, int head, int key_begin, int key_end, ThreadPool* pool);
    void set_views(const Chunk& chunk, const uint8_t* base);
    void finish_prefetch(int layer, Chunk& chunk);
    void settle_prefetches();
    bool decode_frame(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const;  // any thread
    void gather_v(const Chunk& chunk, uint8_t* out) const;  // not while the table grows
    void decode_into(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const;  // both
    void decode_into(int layer, const Chunk& chunk, uint8_t* out);  // caller's thread, timed
    // Raw pool blocks again for the live blocks of chunk whose keep flag is set (all when keep
    // is null); false (nothing changed) when blocks cannot be allocated.
    bool dissolve(int layer, int head, Chunk& chunk, const std::vector<uint8_t>* keep);
    bool repack(int layer, int head, Chunk& chunk, const std::vector<uint8_t>& keep);
    Encoded reencode(int layer, int n_blocks, bool k_only, size_t limit);
    void replace_frame(int layer, Chunk& chunk, std::vector<uint8_t>&& blob, size_t frame_size, int n_blocks);
    void merge_neighbours(int layer, int head);
    bool merge(int layer, Chunk& a, const Chunk& b);
    bool add_v_refs(int layer, int head, Chunk& chunk, const uint8_t* v);
    void compact_table(int layer, int head);
    size_t table_bytes(int layer) const;
    size_t table_bytes() const;
    void drop_chunk(int layer, int head, size_t index);
    void requeue(HeadState& hs);  // a head's blocks moved: its queued blocks are raw again

    const StoreConfig cfg_;
    const int n_layers_, n_kv_heads_, head_dim_, block_tokens_, blocks_per_chunk_;
    const size_t row_bytes_, block_bytes_;
    const KvDtype dtype_;
    const gear::ElementType element_type_;
    BlockPool& pool_;
    std::vector<KvHeadBlocks>& heads_;

    std::vector<HeadState> states_;               // [layer][kv head]
    std::vector<int64_t> stored_chunks_;          // [layer]
    std::vector<StoreLayerStats> layer_stats_;    // [layer]
    double async_wait_us_ = 0.0;
    int queue_peak_ = 0;
    int64_t deferrals_ = 0, stale_jobs_ = 0, candidates_ = 0;
    size_t blob_bytes_ = 0, cache_bytes_ = 0;
    // Written by workers: frames of finished jobs not yet installed, and the workers' buffers.
    std::atomic<size_t> job_bytes_{0}, worker_bytes_{0};
    int active_prefetches_ = 0;

    std::unique_ptr<EncodeBuffers> own_;  // the caller's thread: encoding without workers, checks
    std::unique_ptr<AlignedBytes> scratch_;   // decoded chunks that missed the cache
    size_t scratch_need_ = 0;                 // most scratch one batch needed since schedule()
    // prepare_keys() decodes chunks in batches of up to this many bytes of scratch (more when one
    // key range needs more): at 1024 tokens one batch per layer, at 4096 with H2O about one per
    // evicted layer and four for layers 0-1.
    static constexpr size_t kDecodeBatchBytes = size_t{1} << 19;
    struct Pending {
        Chunk* chunk;
        uint8_t* out;
        bool in_range;  // read by the range being prepared (else by a later one)
    };
    std::vector<Pending> pending_;  // prepare_keys(): chunks to decode
    uint64_t batch_ = 1;            // prepare_keys(): the batch in scratch (Chunk::batch)
    size_t batch_used_ = 0;         // ... and its bytes there
    std::vector<std::unique_ptr<gear::Codec>> decoders_;   // prepare_keys(): [pool thread - 1]
    std::vector<double> decode_us_;                        // prepare_keys(): [pool thread]
    std::unique_ptr<AlignedBytes> read_buf_;  // read_block(): the last chunk it decoded
    const Chunk* read_chunk_ = nullptr;
    std::vector<uint8_t> keep_;               // compact(), truncate(): blocks kept
    std::vector<uint32_t> refs_;              // add_v_refs(): the chunk's row indices
    std::vector<const void*> k_view_, v_view_;
    std::vector<float> q_head_, out_head_;
    std::vector<std::unique_ptr<EncodeBuffers>> workers_;  // [worker]

    uint64_t next_job_ = 1;
    std::unordered_map<uint64_t, std::unique_ptr<Job>> jobs_;  // submitted, not yet processed
    std::vector<std::unique_ptr<Job>> finished_;               // processed encode jobs to install
    std::unique_ptr<WorkQueue> queue_;  // last: joined before anything its jobs point to goes
};

}  // namespace mnn_h2o
