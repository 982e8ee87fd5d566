// How attention and read() see compressed chunks (docs/kv_cache.md "Attention over compressed
// chunks", "Decode cache", "Prefetch"): decoded chunks admitted while they fit the budget
// (scan-resistant, not LRU), decode batches in scratch for the misses, prefetch jobs that fill
// entries ahead of a layer's attention, and the KeySource through which attention() asks for a
// head's keys a range at a time. Caller's thread only, besides the prefetch jobs it submits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/store/chunk_table.h"
#include "mnn_h2o/store/store_chunk.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/store/store_jobs.h"
#include "mnn_h2o/store/store_stats.h"
#include "mnn_h2o/runtime/team.h"

namespace mnn_h2o::store {

class DecodeCache {
public:
    // own: the caller's thread's buffers (its codec decodes on the caller's thread); stats: [layer].
    DecodeCache(const StoreConfig& config, const ChunkCodec& codec, ChunkTable& table, StoreJobs& jobs,
                EncodeBuffers& own, std::vector<StoreLayerStats>& stats);

    // The attention of problem (all heads of layer, as KvCache would run it) with compressed
    // chunks resolved through the cache, one kv head at a time; bit-identical results.
    void attend(int layer, const AttentionProblem& problem, Isa isa, Team* pool, AttentionWorkspace& ws);
    // Starts decoding layer's chunks that are not cached into new entries on the workers, while
    // the budget and the queue have room.
    void prefetch(int layer);
    // K and V rows of block `block` of a head, which must be compressed; valid until the next
    // call into the store.
    void read_block(int layer, int head, int block, const void** k, const void** v);

    // Before chunks change: no prefetch may still read a frame or fill an entry.
    void settle_prefetches();
    // A prefetch job finished (StoreJobs::PrefetchDone).
    void prefetched(Job& job, bool failed);
    // chunk's frame is about to change or go: its entry goes (ChunkTable::Forget).
    void forget(Chunk& chunk);
    // Scratch keeps the size the key ranges since the last call needed (called at each
    // schedule): the whole heads that prefill reads are not held through decode.
    void fit_scratch();
    // Drops every entry and buffer (the cache is being emptied); jobs are reset by their owner.
    void reset();

    size_t entry_bytes() const { return cache_bytes_; }  // entries, with prefetches under way
    size_t scratch_bytes() const { return (scratch_ ? scratch_->size : 0) + (read_buf_ ? read_buf_->size : 0); }

private:
    // attend(): points the views of the chunks that keys [key_begin, key_end) of a head touch at
    // their decoded bytes: an entry, a new one if the budget has room, else scratch.
    void prepare_keys(int layer, int head, int key_begin, int key_end, Team* pool);
    void set_views(const Chunk& chunk, const uint8_t* base);
    void finish_prefetch(int layer, Chunk& chunk);
    void decode_timed(int layer, const Chunk& chunk, uint8_t* out);  // on the caller's codec

    const StoreConfig cfg_;
    const ChunkCodec& codec_;
    ChunkTable& table_;
    StoreJobs& jobs_;
    EncodeBuffers& own_;
    std::vector<StoreLayerStats>& stats_;

    size_t cache_bytes_ = 0;
    int active_prefetches_ = 0;
    std::unique_ptr<AlignedBytes> scratch_;  // decoded chunks that missed the cache
    size_t scratch_need_ = 0;                // most scratch one batch needed since fit_scratch()
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
    std::vector<std::unique_ptr<gear::Codec>> decoders_;  // prepare_keys(): [pool thread - 1]
    std::vector<double> decode_us_;                       // prepare_keys(): [pool thread]
    std::unique_ptr<AlignedBytes> read_buf_;  // read_block(): the last chunk it decoded
    const Chunk* read_chunk_ = nullptr;
    std::vector<const void*> k_view_, v_view_;
    std::vector<float> q_head_, out_head_;
    std::vector<uint8_t> q8_head_;  // the head's q8 rows, when the problem brings them
};

}  // namespace mnn_h2o::store
