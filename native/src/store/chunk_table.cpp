#include "mnn_h2o/store/chunk_table.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "mnn_h2o/store/store_clock.h"

namespace mnn_h2o::store {

ChunkTable::ChunkTable(const KvCacheConfig& cache, const StoreConfig& config, const ChunkCodec& codec, BlockPool& pool,
                       std::vector<KvHeadBlocks>& heads, EncodeBuffers& own, std::vector<StoreLayerStats>& stats,
                       Forget forget)
    : n_layers_(cache.n_layers),
      n_kv_heads_(cache.n_kv_heads),
      block_tokens_(cache.block_tokens),
      blocks_per_chunk_(config.chunk_tokens / cache.block_tokens),
      v_dedup_layers_(config.v_dedup_layers),
      faults_(config.faults),
      codec_(codec),
      pool_(pool),
      blocks_(heads),
      own_(own),
      stats_(stats),
      forget_(std::move(forget)),
      chunks_held_(static_cast<size_t>(cache.n_layers)) {
    heads_state_.reserve(static_cast<size_t>(n_layers_) * n_kv_heads_);
    for (int i = 0; i < n_layers_ * n_kv_heads_; ++i) heads_state_.emplace_back(codec.row_bytes(), block_tokens_, faults_);
}

void ChunkTable::mark(int layer, int h, int first, int n_blocks, uint8_t state) {
    std::vector<uint8_t>& s = head(layer, h).state;
    std::fill(s.begin() + first, s.begin() + first + n_blocks, state);
}

// --- installing frames --------------------------------------------------------------------------

bool ChunkTable::install(int layer, int h, int first, int n_blocks, std::vector<uint8_t>&& frame, bool k_only,
                         const uint8_t* raw) {
    StoreLayerStats& st = stats_[layer];
    HeadChunks& hc = head(layer, h);
    const size_t raw_size = codec_.raw_bytes(n_blocks), half = raw_size / 2;
    auto chunk = std::make_unique<Chunk>();
    chunk->first = first;
    chunk->n_blocks = n_blocks;
    for (int j = 0; j < n_blocks; ++j) chunk->live.push_back(j);
    chunk->frame_size = frame.size();
    chunk->blob = std::move(frame);
    size_t table_growth = 0;
    if (k_only) {
        const size_t rows_before = hc.v_rows.rows();
        if (const auto fallback = hc.v_rows.add_refs(*chunk, raw + half)) {
            if (*fallback == StoreFallback::VerifyMismatch) ++st.verify_mismatches;
            st.count(*fallback);
            return false;
        }
        table_growth = (hc.v_rows.rows() - rows_before) * codec_.row_bytes();
        st.compressed_bytes += static_cast<int64_t>(chunk->blob.size() - chunk->frame_size + table_growth);
    }
    KvHeadBlocks& kv = blocks(layer, h);
    for (int j = first; j < first + n_blocks; ++j) {
        pool_.release(kv.k_blocks[j]);
        pool_.release(kv.v_blocks[j]);
        kv.k_blocks[j] = kv.v_blocks[j] = nullptr;
        hc.state[j] = kStored;
    }
    ++st.chunks_stored;
    st.stored_raw_bytes += static_cast<int64_t>(raw_size);
    st.stored_blob_bytes += static_cast<int64_t>(chunk->blob.size() + table_growth);
    blob_bytes_ += chunk->blob.capacity();
    ++chunks_held_[layer];
    const auto at = std::upper_bound(hc.chunks.begin(), hc.chunks.end(), first,
                                     [](int f, const std::unique_ptr<Chunk>& c) { return f < c->first; });
    hc.chunks.insert(at, std::move(chunk));
    return true;
}

// --- taking frames apart ------------------------------------------------------------------------

const uint8_t* ChunkTable::decoded(int layer, const Chunk& chunk, std::vector<uint8_t>& buf) {
    if (chunk.decoded) return chunk.decoded->data;
    buf.resize(codec_.raw_bytes(chunk.n_blocks));
    const Clock::time_point t0 = Clock::now();
    codec_.decode(chunk, buf.data(), *own_.codec);
    stats_[layer].decode_us += micros_since(t0);
    return buf.data();
}

bool ChunkTable::dissolve(int layer, int h, Chunk& chunk, const std::vector<uint8_t>* keep) {
    KvHeadBlocks& kv = blocks(layer, h);
    HeadChunks& hc = head(layer, h);
    const auto wanted = [&](size_t j) { return !keep || (*keep)[chunk.first + j]; };
    std::vector<void*> got;  // K, V of each wanted block
    if (faults_.alloc_failure) {
        stats_[layer].count(StoreFallback::AllocFailure);
        return false;
    }
    try {
        // Behind the neighbours, so the lists stay contiguous where the pool allows.
        const void* k_after = chunk.first > 0 ? kv.k_blocks[chunk.first - 1] : nullptr;
        const void* v_after = chunk.first > 0 ? kv.v_blocks[chunk.first - 1] : nullptr;
        for (size_t j = 0; j < chunk.live.size(); ++j) {
            if (!wanted(j)) continue;
            got.push_back(pool_.allocate(k_after));
            k_after = got.back();
            got.push_back(pool_.allocate(v_after));
            v_after = got.back();
        }
    } catch (const std::bad_alloc&) {
        for (void* b : got) pool_.release(b);
        stats_[layer].count(StoreFallback::AllocFailure);
        return false;
    }
    const uint8_t* base = decoded(layer, chunk, own_.check);
    const size_t block_bytes = codec_.block_bytes(), half = static_cast<size_t>(chunk.n_blocks) * block_bytes;
    for (size_t j = 0, g = 0; j < chunk.live.size(); ++j) {
        if (!wanted(j)) continue;
        const size_t at = chunk.first + j, from = static_cast<size_t>(chunk.live[j]) * block_bytes;
        std::memcpy(got[g], base + from, block_bytes);
        std::memcpy(got[g + 1], base + half + from, block_bytes);
        kv.k_blocks[at] = got[g];
        kv.v_blocks[at] = got[g + 1];
        hc.state[at] = kRaw;
        g += 2;
    }
    ++stats_[layer].dissolved;
    return true;
}

// Encodes the caller's buffer own_.raw, n blocks, for a chunk re-encoded in place. The result
// counts as verified only when the frame decoded back exactly and is smaller than limit bytes;
// errors are counted as fallbacks.
Encoded ChunkTable::reencode(int layer, int n, bool k_only, size_t limit) {
    StoreLayerStats& st = stats_[layer];
    Encoded e = codec_.encode_checked(own_, n, k_only);
    st.encode_us += e.encode_us;
    st.verify_us += e.verify_us;
    if (!e.encoded) {
        st.count(StoreFallback::EncodeError);
    } else if (e.size < limit && !e.verified) {
        ++st.verify_mismatches;
        st.count(StoreFallback::VerifyMismatch);
    }
    e.verified = e.verified && e.encoded && e.size < limit;
    return e;
}

// H2O trims a few blocks off many chunks at every update. Dissolving them would hand the
// survivors raw blocks until they are encoded again (and H2O trims again soon after); instead the
// survivors are re-encoded here, from the frame, into a smaller frame that replaces it once it
// decodes back exactly. False (chunk unchanged) when that fails or does not compress.
bool ChunkTable::repack(int layer, int h, Chunk& c, const std::vector<uint8_t>& keep) {
    EncodeBuffers& b = own_;
    const uint8_t* base = decoded(layer, c, b.check);
    int n = 0;
    for (size_t j = 0; j < c.live.size(); ++j) n += keep[c.first + j] ? 1 : 0;
    const size_t block_bytes = codec_.block_bytes();
    const size_t old_half = static_cast<size_t>(c.n_blocks) * block_bytes;
    const size_t half = static_cast<size_t>(n) * block_bytes;
    b.raw.resize(2 * half);
    for (size_t j = 0, g = 0; j < c.live.size(); ++j) {
        if (!keep[c.first + j]) continue;
        const size_t from = static_cast<size_t>(c.live[j]) * block_bytes;
        std::memcpy(b.raw.data() + g * block_bytes, base + from, block_bytes);
        std::memcpy(b.raw.data() + half + g * block_bytes, base + old_half + from, block_bytes);
        ++g;
    }
    const bool k_only = c.ref_width > 0;
    const Encoded e = reencode(layer, n, k_only, k_only ? half : b.raw.size());
    if (!e.verified) return false;
    // A dedup chunk keeps the references of its surviving rows (the table is unchanged).
    const int w = c.ref_width;
    const size_t block_refs = static_cast<size_t>(block_tokens_) * w;
    std::vector<uint8_t> blob;
    try {
        if (faults_.alloc_failure) throw std::bad_alloc();
        blob.reserve(e.size + n * block_refs);
        blob.assign(b.frame.data(), b.frame.data() + e.size);
        for (size_t j = 0; j < c.live.size() && w; ++j) {
            if (!keep[c.first + j]) continue;
            const uint8_t* refs = c.blob.data() + c.frame_size + static_cast<size_t>(c.live[j]) * block_refs;
            blob.insert(blob.end(), refs, refs + block_refs);
        }
    } catch (const std::bad_alloc&) {
        stats_[layer].count(StoreFallback::AllocFailure);
        return false;
    }
    if (w) head(layer, h).v_rows.drop(static_cast<size_t>(c.n_blocks - n) * block_tokens_);
    replace_frame(layer, c, std::move(blob), e.size, n);
    ++stats_[layer].repacked;
    return true;
}

// c's frame becomes blob (a frame of n blocks in blob[0, frame_size), then any row references),
// made from the caller's buffers; its cache entry goes.
void ChunkTable::replace_frame(int layer, Chunk& c, std::vector<uint8_t>&& blob, size_t frame_size, int n) {
    forget_(c);
    blob_bytes_ += blob.capacity();
    blob_bytes_ -= c.blob.capacity();
    c.blob = std::move(blob);
    c.frame_size = frame_size;
    c.n_blocks = n;
    c.live.resize(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) c.live[j] = j;
    StoreLayerStats& st = stats_[layer];
    ++st.chunks_encoded;
    st.raw_bytes += static_cast<int64_t>(codec_.raw_bytes(n));
    st.compressed_bytes += static_cast<int64_t>(c.blob.size());
    st.stored_raw_bytes += static_cast<int64_t>(codec_.raw_bytes(n));
    st.stored_blob_bytes += static_cast<int64_t>(c.blob.size());
}

// H2O trims chunks a block or two at a time, and small frames compress worse (on SmolLM2 KV:
// 1.171x at 64 tokens, 1.188x at 128, where the rANS tables per channel group start to pay). So
// after a compaction, neighbouring chunks (adjacent in the head, nothing raw between them) whose
// live blocks fit one chunk together are re-encoded into one frame, which replaces both once it
// decodes back exactly. V dedup chunks are left as they are.
void ChunkTable::merge_neighbours(int layer, int h) {
    HeadChunks& hc = head(layer, h);
    for (size_t i = 0; i + 1 < hc.chunks.size();) {
        Chunk& a = *hc.chunks[i];
        const Chunk& b = *hc.chunks[i + 1];
        const int na = static_cast<int>(a.live.size()), nb = static_cast<int>(b.live.size());
        if (a.end() != b.first || na + nb > blocks_per_chunk_ || a.ref_width || b.ref_width || !merge(layer, a, b)) {
            ++i;
            continue;
        }
        drop_chunk(layer, h, i + 1);  // a now holds b's blocks too: try a with the next one
    }
}

// Encodes a's live blocks followed by b's into one frame that replaces a's. False (nothing
// changed) when that fails or is not smaller than the two frames.
bool ChunkTable::merge(int layer, Chunk& a, const Chunk& b) {
    EncodeBuffers& buf = own_;
    const int na = static_cast<int>(a.live.size()), n = na + static_cast<int>(b.live.size());
    const size_t block_bytes = codec_.block_bytes(), half = static_cast<size_t>(n) * block_bytes;
    buf.raw.resize(2 * half);
    int at = 0;
    for (const Chunk* c : {static_cast<const Chunk*>(&a), &b}) {
        const uint8_t* base = decoded(layer, *c, buf.check);
        const size_t c_half = static_cast<size_t>(c->n_blocks) * block_bytes;
        for (int j : c->live) {
            std::memcpy(buf.raw.data() + at * block_bytes, base + j * block_bytes, block_bytes);
            std::memcpy(buf.raw.data() + half + at * block_bytes, base + c_half + j * block_bytes, block_bytes);
            ++at;
        }
    }
    const Encoded e = reencode(layer, n, false, a.blob.size() + b.blob.size());
    if (!e.verified) return false;
    std::vector<uint8_t> blob;
    try {
        if (faults_.alloc_failure) throw std::bad_alloc();
        blob.assign(buf.frame.data(), buf.frame.data() + e.size);
    } catch (const std::bad_alloc&) {
        stats_[layer].count(StoreFallback::AllocFailure);
        return false;
    }
    replace_frame(layer, a, std::move(blob), e.size, n);
    ++stats_[layer].merged;
    return true;
}

void ChunkTable::drop_chunk(int layer, int h, size_t index) {
    HeadChunks& hc = head(layer, h);
    Chunk& c = *hc.chunks[index];
    if (c.ref_width) hc.v_rows.drop(static_cast<size_t>(c.n_blocks) * block_tokens_);
    forget_(c);
    blob_bytes_ -= c.blob.capacity();
    --chunks_held_[layer];
    hc.chunks.erase(hc.chunks.begin() + static_cast<std::ptrdiff_t>(index));
}

void ChunkTable::dissolve_head(int layer, int h) {
    HeadChunks& hc = head(layer, h);
    while (!hc.chunks.empty()) {
        if (!dissolve(layer, h, *hc.chunks.back(), nullptr)) throw std::bad_alloc();
        drop_chunk(layer, h, hc.chunks.size() - 1);
    }
}

void ChunkTable::requeue(HeadChunks& hc) {
    for (uint8_t& s : hc.state)
        if (s == kQueued) s = kRaw;
    ++hc.generation;
}

// --- following the cache ------------------------------------------------------------------------

void ChunkTable::compact(int layer, int h, const std::vector<TokenRun>& runs, bool block_aligned) {
    HeadChunks& hc = head(layer, h);
    const size_t n_blocks = blocks(layer, h).k_blocks.size();
    hc.state.resize(n_blocks, kRaw);
    requeue(hc);
    if (!block_aligned) {
        // Rows will move across block boundaries: the whole head goes back to raw first.
        dissolve_head(layer, h);
        std::fill(hc.state.begin(), hc.state.end(), kRaw);  // moved rows make new blocks
        return;
    }
    // The blocks KvCache::drop_blocks keeps: those whose first token some run covers.
    keep_.assign(n_blocks, 0);
    std::vector<int> position(n_blocks);  // index after compaction
    for (size_t b = 0, r = 0, kept = 0; b < n_blocks; ++b) {
        const int64_t start = static_cast<int64_t>(b) * block_tokens_;
        while (r < runs.size() && runs[r].offset + runs[r].length <= start) ++r;
        keep_[b] = r < runs.size() && runs[r].offset <= start;
        position[b] = static_cast<int>(kept);
        kept += keep_[b];
    }
    for (size_t i = 0; i < hc.chunks.size();) {
        Chunk& c = *hc.chunks[i];
        int first_kept = -1;
        size_t n_kept = 0;
        for (size_t j = 0; j < c.live.size(); ++j) {
            if (!keep_[c.first + j]) continue;
            if (first_kept < 0) first_kept = c.first + static_cast<int>(j);
            ++n_kept;
        }
        if (n_kept == 0 || (n_kept < c.live.size() && !repack(layer, h, c, keep_) && dissolve(layer, h, c, &keep_))) {
            drop_chunk(layer, h, i);
            continue;
        }
        if (n_kept < c.live.size()) {
            // Neither re-encoded nor dissolved (no raw blocks could be had): the survivors are
            // served from the frame, which still holds the evicted blocks' bytes too.
            std::vector<int> live;
            for (size_t j = 0; j < c.live.size(); ++j)
                if (keep_[c.first + j]) live.push_back(c.live[j]);
            c.live = std::move(live);
        }
        c.first = position[first_kept];
        ++i;
    }
    size_t w = 0;
    for (size_t b = 0; b < n_blocks; ++b)
        if (keep_[b]) hc.state[w++] = hc.state[b];
    hc.state.resize(w);
    merge_neighbours(layer, h);
    hc.v_rows.compact(hc.chunks);
}

void ChunkTable::truncate(int layer, int h, int n_tokens) {
    HeadChunks& hc = head(layer, h);
    const size_t n_blocks = blocks(layer, h).k_blocks.size();
    hc.state.resize(n_blocks, kRaw);
    const int keep_blocks = (n_tokens + block_tokens_ - 1) / block_tokens_;
    const int whole_blocks = n_tokens / block_tokens_;  // blocks left full and unchanged
    keep_.assign(n_blocks, 0);
    std::fill(keep_.begin(), keep_.begin() + keep_blocks, 1);
    for (size_t i = hc.chunks.size(); i-- > 0;) {
        Chunk& c = *hc.chunks[i];
        if (c.end() <= whole_blocks) continue;
        // A chunk reaching the block that appends will write into must be raw again.
        if (c.first < keep_blocks && !dissolve(layer, h, c, &keep_)) throw std::bad_alloc();
        drop_chunk(layer, h, i);
    }
    requeue(hc);
    hc.state.resize(std::min(hc.state.size(), static_cast<size_t>(keep_blocks)));
    hc.v_rows.compact(hc.chunks);
}

void ChunkTable::dissolve_all() {
    for (int layer = 0; layer < n_layers_; ++layer) {
        for (int h = 0; h < n_kv_heads_; ++h) {
            dissolve_head(layer, h);
            head(layer, h).v_rows.clear();
        }
    }
}

void ChunkTable::reset() {
    for (HeadChunks& hc : heads_state_) {
        hc.chunks.clear();
        hc.state.clear();
        hc.v_rows.clear();
        ++hc.generation;
    }
    std::fill(chunks_held_.begin(), chunks_held_.end(), 0);
    blob_bytes_ = 0;
}

// --- accounting ---------------------------------------------------------------------------------

size_t ChunkTable::table_bytes(int layer) const {
    size_t bytes = 0;
    for (int h = 0; h < n_kv_heads_; ++h) bytes += head(layer, h).v_rows.bytes();
    return bytes;
}

size_t ChunkTable::table_bytes() const {
    size_t bytes = 0;
    for (int layer = 0; layer < std::min(v_dedup_layers_, n_layers_); ++layer) bytes += table_bytes(layer);
    return bytes;
}

}  // namespace mnn_h2o::store
