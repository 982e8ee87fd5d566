#include "mnn_h2o/store/lossless_stage.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mnn_h2o/codec/xxhash64.h"

namespace mnn_h2o {

using store::Job;
using store::kQueued;
using store::kRaw;
using store::kSettled;

LosslessStage::ModePlan::ModePlan(const StoreConfig& c)
    : sample_every(c.mode == StoreMode::Probe ? c.probe_every : 1),
      check_blocks(c.mode != StoreMode::Probe),
      keeps_frames(c.mode == StoreMode::Store),
      v_dedup_layers(c.mode == StoreMode::Store ? c.v_dedup_layers : 0) {
    if (c.mode == StoreMode::Off) throw std::logic_error("LosslessStage: the store is off");
}

LosslessStage::LosslessStage(const StoreConfig& config, const KvCacheConfig& cache, BlockPool& pool,
                 std::vector<KvHeadBlocks>& heads)
    : cfg_(config),
      plan_(config),
      n_layers_(cache.n_layers),
      n_kv_heads_(cache.n_kv_heads),
      block_tokens_(cache.block_tokens),
      blocks_per_chunk_(config.chunk_tokens / cache.block_tokens),
      codec_(config, cache),
      layer_stats_(static_cast<size_t>(cache.n_layers)),
      own_(codec_.options()),
      table_(cache, config, codec_, pool, heads, own_, layer_stats_, [this](store::Chunk& c) { cache_.forget(c); }),
      cache_(config, codec_, table_, jobs_, own_, layer_stats_),
      jobs_(config, codec_, [this](Job& job, bool failed) { cache_.prefetched(job, failed); }) {
    if (codec_.block_bytes() != pool.block_bytes()) throw std::logic_error("LosslessStage: block size differs from the pool's");
}

LosslessStage::~LosslessStage() = default;

bool LosslessStage::in_scope(int layer, const EvictionConfig* eviction) const {
    if (cfg_.front_n_scope() && layer < cfg_.front_n) return true;
    return cfg_.kept_scope() && eviction && layer >= eviction->layer_start && layer < eviction->layer_end;
}

// --- making frames ------------------------------------------------------------------------------

void LosslessStage::schedule(const EvictionConfig* eviction) {
    cache_.fit_scratch();
    for (int layer = 0; layer < n_layers_; ++layer)
        if (in_scope(layer, eviction))
            for (int h = 0; h < n_kv_heads_; ++h) schedule_head(layer, h);
}

// A block is cold when it is full, starts at or after hot_sink_tokens and ends at or before
// length - hot_recent_tokens. A run of consecutive raw cold blocks is cut into chunks of
// chunk_tokens from its start; a shorter rest is encoded only once it cannot grow any more,
// i.e. when the block after it is already compressed, queued or settled. A rest that reaches the
// hot recent zone waits: the zone moves on as tokens arrive and the chunk fills up.
void LosslessStage::schedule_head(int layer, int h) {
    const KvHeadBlocks& kv = table_.blocks(layer, h);
    std::vector<uint8_t>& state = table_.head(layer, h).state;
    state.resize(kv.k_blocks.size(), kRaw);
    const int bt = block_tokens_;
    const int cold_begin = (cfg_.hot_sink_tokens + bt - 1) / bt;
    const int cold_end = std::max(0, (kv.length - cfg_.hot_recent_tokens) / bt);
    for (int b = cold_begin; b < cold_end;) {
        if (state[b] != kRaw) {
            ++b;
            continue;
        }
        int e = b;
        while (e < cold_end && state[e] == kRaw) ++e;
        for (int c = b; c < e; c += blocks_per_chunk_) {
            const int n = std::min(blocks_per_chunk_, e - c);
            if (n < blocks_per_chunk_ && e == cold_end) break;
            submit(layer, h, c, n);
        }
        b = e;
    }
}

void LosslessStage::submit(int layer, int h, int first, int n_blocks) {
    if (jobs_.full()) {
        ++deferrals_;  // stays raw; the next end_step tries again
        return;
    }
    if (candidates_++ % plan_.sample_every != 0) {
        table_.mark(layer, h, first, n_blocks, kSettled);
        return;
    }
    auto job = std::make_unique<Job>();
    job->layer = layer;
    job->head = h;
    job->first = first;
    job->n_blocks = n_blocks;
    job->generation = table_.head(layer, h).generation;
    job->raw_size = codec_.raw_bytes(n_blocks);
    job->k_only = layer < plan_.v_dedup_layers;
    const KvHeadBlocks& kv = table_.blocks(layer, h);
    job->k_src.assign(kv.k_blocks.begin() + first, kv.k_blocks.begin() + first + n_blocks);
    job->v_src.assign(kv.v_blocks.begin() + first, kv.v_blocks.begin() + first + n_blocks);
    table_.mark(layer, h, first, n_blocks, kQueued);
    if (jobs_.async()) {
        jobs_.submit(std::move(job));
        return;
    }
    try {
        store::run_encode(codec_, *job, own_, cfg_.faults.worker_exception);
    } catch (...) {
        job->failed = true;
    }
    install(*job, job->failed);
}

void LosslessStage::install_finished() {
    jobs_.collect();
    for (auto& job : jobs_.take_finished()) install(*job, job->failed);
}

void LosslessStage::install(Job& job, bool failed) {
    const int layer = job.layer;
    StoreLayerStats& st = layer_stats_[layer];
    // A job whose head moved meanwhile: its blocks were made raw again then.
    const bool current = job.generation == table_.head(layer, job.head).generation;
    const auto settle = [&] {
        if (current) table_.mark(layer, job.head, job.first, job.n_blocks, kSettled);
    };
    if (failed || !job.encoded) {
        st.count(failed ? StoreFallback::WorkerException : StoreFallback::EncodeError);
        settle();
        return;
    }
    ++st.chunks_encoded;
    st.raw_bytes += static_cast<int64_t>(job.raw_size);
    st.compressed_bytes += static_cast<int64_t>(job.blob.size());
    st.encode_us += job.encode_us;
    st.verify_us += job.verify_us;
    const KvHeadBlocks& kv = table_.blocks(layer, job.head);
    const size_t half = job.raw_size / 2, block_bytes = codec_.block_bytes();
    bool same = job.verified;
    std::vector<uint8_t>& live = own_.check;
    if (same && current && plan_.check_blocks) {
        // The blocks must still hold exactly the bytes that were encoded (verify before free; in
        // full mode, the check that the KV is untouched).
        live.resize(job.raw_size);
        for (int j = 0; j < job.n_blocks; ++j) {
            std::memcpy(live.data() + j * block_bytes, kv.k_blocks[job.first + j], block_bytes);
            std::memcpy(live.data() + half + j * block_bytes, kv.v_blocks[job.first + j], block_bytes);
        }
        same = xxh64(live.data(), live.size()) == job.hash;
    }
    if (!same) {
        ++st.verify_mismatches;
        st.count(StoreFallback::VerifyMismatch);
        settle();
        return;
    }
    // The measuring modes end here: what they measure is the path up to this point, and they
    // keep the KV raw by definition.
    if (!plan_.keeps_frames) {
        settle();
        return;
    }
    if (!current) {
        ++stale_jobs_;
        return;
    }
    // (A K-only frame is judged against K's raw bytes: its V rows cost at most their references
    // more than raw.)
    if (job.blob.size() >= (job.k_only ? half : job.raw_size)) {
        st.count(StoreFallback::Incompressible);
        settle();
        return;
    }
    // live still holds the blocks' bytes, checked against the job's hash above.
    if (!table_.install(layer, job.head, job.first, job.n_blocks, std::move(job.blob), job.k_only, live.data()))
        settle();
}

void LosslessStage::drain() {
    jobs_.drain();
    install_finished();
}

// --- following the cache ------------------------------------------------------------------------

void LosslessStage::compact(int layer, int h, const std::vector<TokenRun>& runs, bool block_aligned) {
    cache_.settle_prefetches();
    jobs_.settle_encodes(layer, h);
    table_.compact(layer, h, runs, block_aligned);
}

void LosslessStage::truncate(int layer, int h, int n_tokens) {
    cache_.settle_prefetches();
    jobs_.settle_encodes(layer, h);
    table_.truncate(layer, h, n_tokens);
}

void LosslessStage::dissolve_all() {
    drain();
    cache_.settle_prefetches();
    table_.dissolve_all();
}

void LosslessStage::reset() {
    jobs_.reset();  // first: no worker reads a block or a frame any more
    table_.reset();
    cache_.reset();
    std::fill(layer_stats_.begin(), layer_stats_.end(), StoreLayerStats{});
    deferrals_ = stale_jobs_ = candidates_ = 0;
    own_.release();
}

// --- accounting ---------------------------------------------------------------------------------

size_t LosslessStage::bytes_held() const {
    return table_.blob_bytes() + table_.table_bytes() + cache_.entry_bytes() + jobs_.bytes() + own_.bytes() +
           cache_.scratch_bytes();
}

StoreStats LosslessStage::stats() const {
    StoreStats s;
    s.mode = cfg_.mode;
    s.layers.resize(static_cast<size_t>(n_layers_));
    for (int layer = 0; layer < n_layers_; ++layer) {
        StoreStats::Layer& l = s.layers[layer];
        l.counters = layer_stats_[layer];
        for (int h = 0; h < n_kv_heads_; ++h)
            for (const auto& c : table_.head(layer, h).chunks) {
                ++l.chunks_held;
                l.blob_bytes += c->blob.capacity();
                l.held_raw_bytes += codec_.raw_bytes(static_cast<int>(c->live.size()));
            }
        l.table_bytes = table_.table_bytes(layer);
        s.table_bytes += l.table_bytes;
        s.total += l.counters;
        s.chunks_held += l.chunks_held;
        s.held_raw_bytes += l.held_raw_bytes;
    }
    // Store mode: what the chunks held now stand for over what they hold (a chunk re-encoded five
    // times counts once); the modes that hold nothing: over everything encoded.
    const bool held = plan_.keeps_frames;
    const double raw = held ? static_cast<double>(s.held_raw_bytes) : static_cast<double>(s.total.raw_bytes);
    const double packed = held ? static_cast<double>(table_.blob_bytes() + s.table_bytes)
                               : static_cast<double>(s.total.compressed_bytes);
    if (raw > 0 && packed > 0) s.lossless_ratio = raw / packed;
    s.async_wait_us = jobs_.wait_us();
    s.queue_peak = jobs_.peak();
    s.deferrals = deferrals_;
    s.stale_jobs = stale_jobs_;
    s.blob_bytes = table_.blob_bytes();
    s.cache_bytes = cache_.entry_bytes();
    s.scratch_bytes = bytes_held() - s.blob_bytes - s.table_bytes - s.cache_bytes;
    return s;
}

}  // namespace mnn_h2o
