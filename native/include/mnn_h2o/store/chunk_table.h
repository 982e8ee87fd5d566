// The store's chunks, per kv head: which blocks are raw, queued, stored or settled, the chunks
// that hold the stored ones (ordered by position), and the V row table of a dedup head. It
// installs checked frames in place of raw blocks (the blocks go back to the pool), and when the
// cache moves or drops blocks it makes the chunks follow: re-encoding trimmed chunks, merging
// trimmed neighbours, dissolving chunks into raw blocks again (docs/kv_cache.md "Eviction and
// truncation"). Caller's thread only; every job reading a head's blocks or frames must have been
// settled before the head changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/store/head_v_rows.h"
#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/cache/kv_head_blocks.h"
#include "mnn_h2o/store/store_chunk.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/store/store_stats.h"

namespace mnn_h2o::store {

struct HeadChunks {
    HeadChunks(size_t row_bytes, int block_tokens, const StoreFaults& faults) : v_rows(row_bytes, block_tokens, faults) {}
    std::vector<uint8_t> state;                  // BlockState per block of the head
    std::vector<std::unique_ptr<Chunk>> chunks;  // ordered by position
    uint64_t generation = 0;                     // bumped whenever the head's blocks move
    HeadVRows v_rows;                            // V dedup layers: the distinct V rows
};

class ChunkTable {
public:
    // A chunk's frame is about to change or go: its decode cache entry must go first.
    using Forget = std::function<void(Chunk&)>;

    // heads: the cache's [layer][kv head] block lists; pool: where their blocks come from;
    // own: the caller's thread's buffers (shared with the rest of the store); stats: [layer].
    ChunkTable(const KvCacheConfig& cache, const StoreConfig& config, const ChunkCodec& codec, BlockPool& pool,
               std::vector<KvHeadBlocks>& heads, EncodeBuffers& own, std::vector<StoreLayerStats>& stats, Forget forget);

    int n_layers() const { return n_layers_; }
    int n_kv_heads() const { return n_kv_heads_; }
    HeadChunks& head(int layer, int h) { return heads_state_[index(layer, h)]; }
    const HeadChunks& head(int layer, int h) const { return heads_state_[index(layer, h)]; }
    KvHeadBlocks& blocks(int layer, int h) { return blocks_[index(layer, h)]; }
    bool holds_compressed(int layer) const { return chunks_held_[layer] > 0; }
    // Sets blocks [first, first + n_blocks) of a head to state (a BlockState).
    void mark(int layer, int h, int first, int n_blocks, uint8_t state);

    // A checked frame of blocks [first, first + n_blocks) of a head replaces them (raw: their
    // bytes, K then V, checked against what was encoded); the blocks go back to the pool. A
    // k_only frame's V rows go to the head's table first; false (a fallback, counted; nothing
    // changed) when that fails.
    bool install(int layer, int h, int first, int n_blocks, std::vector<uint8_t>&& frame, bool k_only,
                 const uint8_t* raw);

    // The cache compacts a head by a valid plan (LosslessStage::compact) or keeps its first n_tokens
    // (LosslessStage::truncate); both throw std::bad_alloc with the data valid when raw blocks cannot be
    // had for a chunk that must be dissolved.
    void compact(int layer, int h, const std::vector<TokenRun>& runs, bool block_aligned);
    void truncate(int layer, int h, int n_tokens);
    // Every chunk of every head back to raw blocks; throws std::bad_alloc as above.
    void dissolve_all();
    // Drops every chunk and table (the cache is being emptied).
    void reset();

    size_t blob_bytes() const { return blob_bytes_; }  // frames held (capacity)
    size_t table_bytes(int layer) const;               // the V row tables of a layer
    size_t table_bytes() const;                        // ... of every dedup layer

private:
    size_t index(int layer, int h) const { return static_cast<size_t>(layer) * n_kv_heads_ + h; }
    // chunk's bytes, [2][n_blocks][block]: its cache entry, else decoded into buf.
    const uint8_t* decoded(int layer, const Chunk& chunk, std::vector<uint8_t>& buf);
    // Raw pool blocks again for the live blocks of chunk whose keep flag is set (all when keep is
    // null); false (nothing changed) when blocks cannot be allocated.
    bool dissolve(int layer, int h, Chunk& chunk, const std::vector<uint8_t>* keep);
    bool repack(int layer, int h, Chunk& chunk, const std::vector<uint8_t>& keep);
    Encoded reencode(int layer, int n_blocks, bool k_only, size_t limit);
    void replace_frame(int layer, Chunk& chunk, std::vector<uint8_t>&& blob, size_t frame_size, int n_blocks);
    void merge_neighbours(int layer, int h);
    bool merge(int layer, Chunk& a, const Chunk& b);
    void drop_chunk(int layer, int h, size_t index);
    void dissolve_head(int layer, int h);  // throws std::bad_alloc
    void requeue(HeadChunks& hc);  // a head's blocks moved: its queued blocks are raw again

    const int n_layers_, n_kv_heads_, block_tokens_, blocks_per_chunk_, v_dedup_layers_;
    const StoreFaults faults_;
    const ChunkCodec& codec_;
    BlockPool& pool_;
    std::vector<KvHeadBlocks>& blocks_;
    EncodeBuffers& own_;
    std::vector<StoreLayerStats>& stats_;
    const Forget forget_;
    std::vector<HeadChunks> heads_state_;  // [layer][kv head]
    std::vector<int64_t> chunks_held_;     // [layer]
    size_t blob_bytes_ = 0;
    std::vector<uint8_t> keep_;  // compact(), truncate(): blocks kept
};

}  // namespace mnn_h2o::store
