#include "mnn_h2o/store/decode_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mnn_h2o/store/store_clock.h"

namespace mnn_h2o::store {

DecodeCache::DecodeCache(const StoreConfig& config, const ChunkCodec& codec, ChunkTable& table, StoreJobs& jobs,
                         EncodeBuffers& own, std::vector<StoreLayerStats>& stats)
    : cfg_(config), codec_(codec), table_(table), jobs_(jobs), own_(own), stats_(stats) {}

void DecodeCache::decode_timed(int layer, const Chunk& chunk, uint8_t* out) {
    const Clock::time_point t0 = Clock::now();
    codec_.decode(chunk, out, *own_.codec);
    stats_[layer].decode_us += micros_since(t0);
}

void DecodeCache::fit_scratch() {
    if (scratch_ && scratch_->size > scratch_need_) {
        scratch_.reset();
        if (scratch_need_ > 0) scratch_ = std::make_unique<AlignedBytes>(scratch_need_);
    }
    scratch_need_ = 0;
}

void DecodeCache::forget(Chunk& c) {
    if (c.decoded) {
        cache_bytes_ -= c.decoded->size;
        c.decoded.reset();
    }
    if (read_chunk_ == &c) read_chunk_ = nullptr;
}

void DecodeCache::reset() {
    cache_bytes_ = 0;
    active_prefetches_ = 0;
    scratch_.reset();
    scratch_need_ = 0;
    read_buf_.reset();
    read_chunk_ = nullptr;
}

// --- prefetch -----------------------------------------------------------------------------------

void DecodeCache::prefetch(int layer) {
    if (!cfg_.prefetch || !jobs_.async() || layer < 0 || layer >= table_.n_layers() || !table_.holds_compressed(layer))
        return;
    for (int h = 0; h < table_.n_kv_heads(); ++h) {
        for (const auto& c : table_.head(layer, h).chunks) {
            if (c->decoded || c->prefetch) continue;
            const size_t bytes = codec_.raw_bytes(c->n_blocks);
            if (cache_bytes_ + bytes > static_cast<size_t>(cfg_.decode_cache_bytes) || jobs_.full()) return;
            auto job = std::make_unique<Job>();
            job->kind = Job::Kind::Prefetch;
            job->layer = layer;
            job->head = h;
            job->chunk = c.get();
            job->dest = std::make_unique<AlignedBytes>(bytes);
            cache_bytes_ += bytes;
            c->prefetch = job.get();
            ++active_prefetches_;
            jobs_.submit(std::move(job));
        }
    }
}

void DecodeCache::prefetched(Job& job, bool failed) {
    Chunk* chunk = job.chunk;
    chunk->prefetch = nullptr;
    --active_prefetches_;
    stats_[job.layer].decode_us += job.decode_us;
    if (!failed && job.decoded_ok) {
        if (chunk->ref_width) codec_.gather_v(*chunk, job.dest->data);
        chunk->decoded = std::move(job.dest);
    } else {
        cache_bytes_ -= job.dest->size;
    }
}

void DecodeCache::finish_prefetch(int layer, Chunk& chunk) {
    Job* job = chunk.prefetch;
    int expected = kWaiting;
    if (job->progress.compare_exchange_strong(expected, kCancelled)) {
        // Not started yet: decode it here, into the room reserved for it.
        job->chunk = nullptr;
        chunk.prefetch = nullptr;
        --active_prefetches_;
        chunk.decoded = std::move(job->dest);
        decode_timed(layer, chunk, chunk.decoded->data);
        ++stats_[layer].cache_misses;
        return;
    }
    jobs_.wait_until([&] { return chunk.prefetch == nullptr; });
    if (chunk.decoded) ++stats_[layer].cache_hits;
}

void DecodeCache::settle_prefetches() {
    if (active_prefetches_ == 0) return;
    jobs_.cancel_waiting_prefetches([&](Job& job) {
        cache_bytes_ -= job.dest->size;
        job.dest.reset();
        job.chunk->prefetch = nullptr;
        job.chunk = nullptr;
        --active_prefetches_;
    });
    jobs_.wait_until([&] { return active_prefetches_ == 0; });
}

// --- attention ----------------------------------------------------------------------------------

// The attention scans every chunk of every layer at every step, a cyclic scan: an LRU cache
// smaller than the scan would evict each entry just before it is needed again and never hit.
// So a decoded chunk is admitted only while it fits the budget, and entries stay until their
// chunk goes; misses beyond the budget decode into scratch (scan-resistant).
//
// attention() asks for a head's keys one split (decode) or one head (prefill) at a time, in
// order, and attend() runs the heads in order. When a range needs a chunk that is not decoded,
// a *batch* starts there: the range's chunks and, while they fit kDecodeBatchBytes, the chunks
// the next ranges of this layer will need, decoded at once on the pool's threads. One batch per
// layer instead of one parallel decode per split: each wakes the workers, and on a VM that
// costs tens of microseconds (at 1024 tokens a layer's chunks fill one batch).
void DecodeCache::prepare_keys(int layer, int h, int key_begin, int key_end, Team* pool) {
    StoreLayerStats& st = stats_[layer];
    const int block_tokens = codec_.block_tokens();
    const int first_block = key_begin / block_tokens;
    const int end_block = (key_end + block_tokens - 1) / block_tokens;
    const auto in_range = [&](const Chunk& c) { return c.end() > first_block && c.first < end_block; };
    // Resolve what is decoded already; find the first chunk of the range that is not.
    std::vector<std::unique_ptr<Chunk>>& chunks = table_.head(layer, h).chunks;
    size_t start = chunks.size();
    for (size_t i = 0; i < chunks.size(); ++i) {
        Chunk& c = *chunks[i];
        if (!in_range(c)) continue;
        if (c.prefetch) finish_prefetch(layer, c);
        else if (c.decoded) ++st.cache_hits;
        if (c.decoded) set_views(c, c.decoded->data);
        else if (c.batch == batch_) set_views(c, scratch_->data + c.batch_offset);
        else if (start == chunks.size()) start = i;
    }
    if (start == chunks.size()) return;

    // A new batch. The range's chunks of the old one (the old one's last: it ran in the same
    // order) move to the front of scratch instead of being decoded again.
    const uint64_t old_batch = batch_++;
    size_t carried_from = SIZE_MAX, used = 0;
    for (const auto& c : chunks)
        if (c->batch == old_batch && in_range(*c) && c->batch_offset < carried_from) carried_from = c->batch_offset;
    if (carried_from != SIZE_MAX) used = batch_used_ - carried_from;
    pending_.clear();
    size_t need = used;
    // Candidates in the order the attention reads them: this head from `start`, then the next
    // heads. The range's chunks always join; the rest while the batch has room.
    for (int head = h; head < table_.n_kv_heads(); ++head) {
        std::vector<std::unique_ptr<Chunk>>& s = table_.head(layer, head).chunks;
        bool full = false;
        for (size_t i = head == h ? start : 0; i < s.size(); ++i) {
            Chunk& c = *s[i];
            if (c.decoded || c.prefetch || c.batch == old_batch) continue;
            const bool needed = head == h && in_range(c);
            const size_t bytes = codec_.raw_bytes(c.n_blocks);
            if (!needed && need + bytes > kDecodeBatchBytes) {
                full = true;
                break;
            }
            ++st.cache_misses;
            if (cache_bytes_ + bytes <= static_cast<size_t>(cfg_.decode_cache_bytes)) {
                c.decoded = std::make_unique<AlignedBytes>(bytes);
                cache_bytes_ += bytes;
                pending_.push_back({&c, c.decoded->data, needed});
            } else {
                c.batch = batch_;
                c.batch_offset = need;
                pending_.push_back({&c, nullptr, needed});
                need += bytes;
            }
        }
        if (full) break;
    }
    scratch_need_ = std::max(scratch_need_, need);
    if (need > 0 && (!scratch_ || scratch_->size < need)) {
        auto bigger = std::make_unique<AlignedBytes>(need);
        if (used) std::memcpy(bigger->data, scratch_->data + carried_from, used);
        scratch_ = std::move(bigger);
    } else if (used) {
        std::memmove(scratch_->data, scratch_->data + carried_from, used);
    }
    if (used)
        for (const auto& c : chunks)
            if (c->batch == old_batch && in_range(*c)) {
                c->batch = batch_;
                c->batch_offset -= carried_from;
                set_views(*c, scratch_->data + c->batch_offset);
            }
    batch_used_ = need;
    for (Pending& d : pending_)
        if (!d.out) d.out = scratch_->data + d.chunk->batch_offset;

    const int n_threads = pool ? pool->size() : 1;
    while (static_cast<int>(decoders_.size()) + 1 < n_threads) decoders_.push_back(codec_.decoder());
    decode_us_.assign(static_cast<size_t>(n_threads), 0.0);
    const auto decode_one = [&](int i, int thread) {
        const Clock::time_point t0 = Clock::now();
        codec_.decode(*pending_[i].chunk, pending_[i].out, thread == 0 ? *own_.codec : *decoders_[thread - 1]);
        decode_us_[thread] += micros_since(t0);
    };
    const int n = static_cast<int>(pending_.size());
    ++st.decode_batches;
    if (pool && n > 1) pool->parallel_for(n, decode_one);
    else
        for (int i = 0; i < n; ++i) decode_one(i, 0);
    for (double us : decode_us_) st.decode_us += us;
    for (const Pending& d : pending_)
        if (d.in_range) set_views(*d.chunk, d.out);  // the later ranges' views are set when they come
}

// Points the attention views of chunk's live blocks at its decoded bytes.
void DecodeCache::set_views(const Chunk& c, const uint8_t* base) {
    const size_t block_bytes = codec_.block_bytes(), half = static_cast<size_t>(c.n_blocks) * block_bytes;
    for (size_t j = 0; j < c.live.size(); ++j) {
        k_view_[c.first + j] = base + c.live[j] * block_bytes;
        v_view_[c.first + j] = base + half + c.live[j] * block_bytes;
    }
}

void DecodeCache::attend(int layer, const AttentionProblem& p, Isa isa, Team* pool, AttentionWorkspace& ws) {
    const int G = p.group, hd = p.head_dim, n_heads = p.n_kv_heads * G;
    int split_keys = 0;
    for (int h = 0; h < p.n_kv_heads; ++h) split_keys = std::max(split_keys, p.heads[h].n_keys);
    const size_t group_floats = static_cast<size_t>(G) * hd;
    q_head_.resize(static_cast<size_t>(p.n_q) * group_floats);
    out_head_.resize(q_head_.size());
    const size_t group_q8 = p.q8_rows ? G * kv_row_bytes(KvDtype::Q8, hd) : 0;
    q8_head_.resize(static_cast<size_t>(p.n_q) * group_q8);
    ++batch_;  // a new layer: nothing of it is in scratch yet
    batch_used_ = 0;
    for (int h = 0; h < p.n_kv_heads; ++h) {
        const KvHeadBlocks& kv = table_.blocks(layer, h);
        // Compressed blocks are null in the lists; prepare_keys() points them at decoded bytes.
        k_view_.assign(kv.k_blocks.begin(), kv.k_blocks.end());
        v_view_.assign(kv.v_blocks.begin(), kv.v_blocks.end());
        struct Source final : KeySource {
            DecodeCache* cache;
            int layer, head;
            Team* pool;
            void prepare(int, int key_begin, int key_end) override {
                cache->prepare_keys(layer, head, key_begin, key_end, pool);
            }
        } source;
        source.cache = this;
        source.layer = layer;
        source.head = h;
        source.pool = pool;
        KvHeadView view;
        view.k_blocks = k_view_.data();
        view.v_blocks = v_view_.data();
        view.n_keys = p.heads[h].n_keys;
        for (int t = 0; t < p.n_q; ++t) {
            std::memcpy(q_head_.data() + t * group_floats, p.q + (static_cast<size_t>(t) * n_heads + h * G) * hd,
                        group_floats * sizeof(float));
            if (group_q8)
                std::memcpy(q8_head_.data() + t * group_q8, p.q8_rows + (static_cast<size_t>(t) * p.n_kv_heads + h) * group_q8,
                            group_q8);
        }
        AttentionProblem one = p;
        one.n_kv_heads = 1;
        one.heads = &view;
        one.q = q_head_.data();
        one.q8_rows = group_q8 ? q8_head_.data() : nullptr;
        one.out = out_head_.data();
        one.block_scores = p.block_scores ? p.block_scores + static_cast<size_t>(h) * p.scores_stride : nullptr;
        one.window_scores = p.window_scores ? p.window_scores + static_cast<size_t>(h) * p.scores_stride : nullptr;
        one.block_max = p.block_max ? p.block_max + static_cast<size_t>(h) * p.scores_stride : nullptr;
        one.split_keys = split_keys;
        one.split_kv_heads = p.n_kv_heads;
        attention(one, isa, pool, ws, &source);
        for (int t = 0; t < p.n_q; ++t)
            std::memcpy(p.out + (static_cast<size_t>(t) * n_heads + h * G) * hd, out_head_.data() + t * group_floats,
                        group_floats * sizeof(float));
    }
}

// --- read() -------------------------------------------------------------------------------------

void DecodeCache::read_block(int layer, int h, int block, const void** k, const void** v) {
    settle_prefetches();
    for (const auto& c : table_.head(layer, h).chunks) {
        if (block < c->first || block >= c->end()) continue;
        const uint8_t* base;
        if (c->decoded) {
            base = c->decoded->data;
        } else {
            const size_t bytes = codec_.raw_bytes(c->n_blocks);
            if (read_chunk_ != c.get()) {
                if (!read_buf_ || read_buf_->size < bytes) read_buf_ = std::make_unique<AlignedBytes>(bytes);
                decode_timed(layer, *c, read_buf_->data);
                read_chunk_ = c.get();
            }
            base = read_buf_->data;
        }
        const size_t block_bytes = codec_.block_bytes();
        const size_t frame_block = static_cast<size_t>(c->live[block - c->first]);
        *k = base + frame_block * block_bytes;
        *v = base + static_cast<size_t>(c->n_blocks) * block_bytes + frame_block * block_bytes;
        return;
    }
    throw std::logic_error("LosslessStage: block is not compressed");
}

}  // namespace mnn_h2o::store
