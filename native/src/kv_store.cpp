#include "mnn_h2o/kv_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>

#include "mnn_h2o/xxhash64.h"

namespace mnn_h2o {

namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// What a block of a head is to the store.
enum BlockState : uint8_t {
    kRaw = 0,  // raw; becomes part of a chunk once cold
    kQueued,   // raw; a job is encoding its chunk
    kStored,   // compressed: null in the head's lists, its bytes in a chunk's frame
    kSettled,  // raw for good: measured (probe, full) or left raw by a fallback, never retried
};

// A job's progress; the caller may take a job over (prefetch) or cancel it (encode) before a
// worker starts it.
enum JobProgress : int { kWaiting = 0, kRunning, kCancelled, kDone };

gear::ElementType element_type_of(KvDtype dtype) {
    switch (dtype) {
        case KvDtype::F16: return gear::ElementType::F16;
        case KvDtype::BF16: return gear::ElementType::BF16;
        case KvDtype::F32: return gear::ElementType::F32;
        default: break;  // refused by validate_store_config
    }
    throw std::invalid_argument(std::string("KvStore: the lossless store does not take dtype ") + kv_dtype_name(dtype));
}

gear::EncodeOptions codec_options(const StoreConfig& c) {
    gear::EncodeOptions o;
    o.zstd_level = c.zstd_level;
    return o;
}

void add(StoreLayerStats& to, const StoreLayerStats& from) {
    to.chunks_encoded += from.chunks_encoded;
    to.chunks_stored += from.chunks_stored;
    to.raw_bytes += from.raw_bytes;
    to.compressed_bytes += from.compressed_bytes;
    to.stored_raw_bytes += from.stored_raw_bytes;
    to.stored_blob_bytes += from.stored_blob_bytes;
    to.encode_us += from.encode_us;
    to.verify_us += from.verify_us;
    to.decode_us += from.decode_us;
    to.verify_mismatches += from.verify_mismatches;
    to.cache_hits += from.cache_hits;
    to.cache_misses += from.cache_misses;
    to.dissolved += from.dissolved;
    to.repacked += from.repacked;
    to.merged += from.merged;
    to.decode_batches += from.decode_batches;
    for (int r = 0; r < kStoreFallbacks; ++r) to.fallbacks[r] += from.fallbacks[r];
}

}  // namespace

const char* store_fallback_name(StoreFallback reason) {
    switch (reason) {
        case StoreFallback::Incompressible: return "incompressible";
        case StoreFallback::EncodeError: return "encode_error";
        case StoreFallback::VerifyMismatch: return "verify_mismatch";
        case StoreFallback::AllocFailure: return "alloc_failure";
        case StoreFallback::WorkerException: return "worker_exception";
    }
    return "?";
}

// 64-byte aligned bytes, like pool blocks: the attention kernels read decoded chunks as blocks.
struct KvStore::AlignedBytes {
    explicit AlignedBytes(size_t n)
        : data(static_cast<uint8_t*>(::operator new(n, std::align_val_t(64)))), size(n) {}
    ~AlignedBytes() { ::operator delete(data, std::align_val_t(64)); }
    AlignedBytes(const AlignedBytes&) = delete;
    AlignedBytes& operator=(const AlignedBytes&) = delete;
    uint8_t* const data;
    const size_t size;
};

// A compressed run of blocks of one head: one frame of [2][n_blocks * block_tokens][head_dim]
// (K then V). In a V dedup layer the frame holds K only, [1][n_blocks * block_tokens][head_dim],
// and the blob goes on with one index into the head's row table per V row (ref_width bytes each,
// little-endian).
struct KvStore::Chunk {
    int first = 0;          // position of its first live block in the head's lists
    int n_blocks = 0;       // blocks in the frame
    std::vector<int> live;  // frame blocks the head still holds, at positions first, first+1, ...
    std::vector<uint8_t> blob;
    size_t frame_size = 0;            // the frame: blob[0, frame_size)
    int ref_width = 0;                // 0: V is in the frame; 2 or 4: V row indices follow it
    const RowTable* table = nullptr;  // with ref_width: the head's table
    std::unique_ptr<AlignedBytes> decoded;  // its decode cache entry
    Job* prefetch = nullptr;                // a prefetch job that may still fill `decoded`
    uint64_t batch = 0;          // prepare_keys(): the decode batch it is in (KvStore::batch_)
    size_t batch_offset = 0;     // ... and where in scratch its bytes are
};

struct KvStore::Job {
    enum class Kind { Encode, Prefetch };
    Kind kind = Kind::Encode;
    int layer = 0, head = 0;
    // Taken with a compare-exchange from kWaiting by whoever runs or cancels the job first.
    std::atomic<int> progress{kWaiting};
    // Encode: the worker reads the chunk's raw blocks in place (no copy: the caller settles a
    // head's jobs before any of its blocks can be released or written), then fills the rest.
    int first = 0, n_blocks = 0;
    bool k_only = false;  // a V dedup layer: the frame holds K; V rows go to the table on install
    uint64_t generation = 0;
    std::vector<const void*> k_src, v_src;
    size_t raw_size = 0;
    std::vector<uint8_t> blob;
    size_t held = 0;  // blob bytes counted in job_bytes_ until the job is installed or dropped
    uint64_t hash = 0;
    bool encoded = false, verified = false, failed = false;
    double encode_us = 0.0, verify_us = 0.0;
    // Prefetch: decodes chunk's frame into dest, the room reserved for it in the cache.
    Chunk* chunk = nullptr;  // null once the caller has taken the job over
    std::unique_ptr<AlignedBytes> dest;
    bool decoded_ok = false;
    double decode_us = 0.0;
};

// What one thread needs to encode: its codec and buffers, reused from job to job.
struct KvStore::EncodeBuffers {
    explicit EncodeBuffers(const gear::EncodeOptions& options) : codec(options) {}
    gear::Codec codec;
    std::vector<uint8_t> raw;    // the chunk gathered from its blocks, K then V
    std::vector<uint8_t> frame;  // encoder output, worst-case sized
    std::vector<uint8_t> check;  // the frame decoded again
    size_t bytes() const { return raw.capacity() + frame.capacity() + check.capacity(); }
};

struct KvStore::HeadState {
    std::vector<uint8_t> state;                 // BlockState per block of the head
    std::vector<std::unique_ptr<Chunk>> chunks; // ordered by position
    uint64_t generation = 0;                    // bumped whenever the head's blocks move
    std::unique_ptr<RowTable> table;            // V dedup layers: the distinct V rows
    size_t dropped_refs = 0;                    // references to table rows dropped since its last compaction
};

namespace {

uint32_t read_ref(const uint8_t* p, int width) {
    uint32_t x = 0;
    for (int i = 0; i < width; ++i) x |= static_cast<uint32_t>(p[i]) << (8 * i);
    return x;
}

void write_ref(uint8_t* p, int width, uint32_t x) {
    for (int i = 0; i < width; ++i) p[i] = static_cast<uint8_t>(x >> (8 * i));
}

}  // namespace

KvStore::KvStore(const StoreConfig& config, const KvCacheConfig& cache, BlockPool& pool,
                 std::vector<KvHeadBlocks>& heads)
    : cfg_(config),
      n_layers_(cache.n_layers),
      n_kv_heads_(cache.n_kv_heads),
      head_dim_(cache.head_dim),
      block_tokens_(cache.block_tokens),
      blocks_per_chunk_(config.chunk_tokens / cache.block_tokens),
      row_bytes_(kv_row_bytes(cache.dtype, cache.head_dim)),
      block_bytes_(row_bytes_ * cache.block_tokens),
      dtype_(cache.dtype),
      element_type_(element_type_of(cache.dtype)),
      pool_(pool),
      heads_(heads),
      states_(static_cast<size_t>(cache.n_layers) * cache.n_kv_heads),
      stored_chunks_(static_cast<size_t>(cache.n_layers)),
      layer_stats_(static_cast<size_t>(cache.n_layers)),
      own_(std::make_unique<EncodeBuffers>(codec_options(config))) {
    if (block_bytes_ != pool.block_bytes()) throw std::logic_error("KvStore: block size differs from the pool's");
    if (cfg_.async_threads > 0) {
        for (int t = 0; t < cfg_.async_threads; ++t) workers_.push_back(std::make_unique<EncodeBuffers>(codec_options(cfg_)));
        queue_ = std::make_unique<WorkQueue>(cfg_.async_threads, cfg_.max_queue);
    }
}

KvStore::~KvStore() {
    queue_.reset();  // workers stop before the jobs and frames they read go
}

KvStore::HeadState& KvStore::state(int layer, int head) {
    return states_[static_cast<size_t>(layer) * n_kv_heads_ + head];
}

bool KvStore::in_scope(int layer, const H2oConfig* h2o) const {
    if (layer < cfg_.front_n) return true;
    return cfg_.h2o_kept && h2o && layer >= h2o->layer_start && layer < h2o->layer_end;
}

// --- making frames ------------------------------------------------------------------------------

void KvStore::schedule(const H2oConfig* h2o) {
    if (cfg_.mode == StoreMode::Off) return;
    // Scratch keeps the size the key ranges of the steps since the last call needed: the whole
    // heads that prefill reads are not held through decode, which reads a split at a time.
    if (scratch_ && scratch_->size > scratch_need_) {
        scratch_.reset();
        if (scratch_need_ > 0) scratch_ = std::make_unique<AlignedBytes>(scratch_need_);
    }
    scratch_need_ = 0;
    for (int layer = 0; layer < n_layers_; ++layer)
        if (in_scope(layer, h2o))
            for (int h = 0; h < n_kv_heads_; ++h) schedule_head(layer, h);
}

// A block is cold when it is full, starts at or after hot_sink_tokens and ends at or before
// length - hot_recent_tokens. A run of consecutive raw cold blocks is cut into chunks of
// chunk_tokens from its start; a shorter rest is encoded only once it cannot grow any more,
// i.e. when the block after it is already compressed, queued or settled. A rest that reaches the
// hot recent zone waits: the zone moves on as tokens arrive and the chunk fills up.
void KvStore::schedule_head(int layer, int h) {
    const KvHeadBlocks& kv = blocks(layer, h);
    HeadState& hs = state(layer, h);
    hs.state.resize(kv.k_blocks.size(), kRaw);
    const int bt = block_tokens_;
    const int cold_begin = (cfg_.hot_sink_tokens + bt - 1) / bt;
    const int cold_end = std::max(0, (kv.length - cfg_.hot_recent_tokens) / bt);
    for (int b = cold_begin; b < cold_end;) {
        if (hs.state[b] != kRaw) {
            ++b;
            continue;
        }
        int e = b;
        while (e < cold_end && hs.state[e] == kRaw) ++e;
        for (int c = b; c < e; c += blocks_per_chunk_) {
            const int n = std::min(blocks_per_chunk_, e - c);
            if (n < blocks_per_chunk_ && e == cold_end) break;
            submit(layer, h, c, n);
        }
        b = e;
    }
}

void KvStore::submit(int layer, int h, int first, int n_blocks) {
    if (queue_ && queue_->outstanding() >= queue_->capacity()) {
        ++deferrals_;  // stays raw; the next end_step tries again
        return;
    }
    HeadState& hs = state(layer, h);
    const auto mark = [&](uint8_t s) { std::fill(hs.state.begin() + first, hs.state.begin() + first + n_blocks, s); };
    if (cfg_.mode == StoreMode::Probe && candidates_++ % cfg_.probe_every != 0) {
        mark(kSettled);
        return;
    }
    auto job = std::make_unique<Job>();
    job->layer = layer;
    job->head = h;
    job->first = first;
    job->n_blocks = n_blocks;
    job->generation = hs.generation;
    job->raw_size = chunk_raw_bytes(n_blocks);
    job->k_only = dedup_layer(layer);
    const KvHeadBlocks& kv = blocks(layer, h);
    job->k_src.assign(kv.k_blocks.begin() + first, kv.k_blocks.begin() + first + n_blocks);
    job->v_src.assign(kv.v_blocks.begin() + first, kv.v_blocks.begin() + first + n_blocks);
    mark(kQueued);
    if (!queue_) {
        try {
            run_encode(*job, *own_);
        } catch (...) {
            job->failed = true;
        }
        install(*job, job->failed);
        return;
    }
    Job* j = job.get();
    const uint64_t id = next_job_++;
    jobs_.emplace(id, std::move(job));
    // Cannot be refused: only this thread submits, and it checked the room above.
    queue_->try_submit(id, [this, j](int worker) {
        int expected = kWaiting;
        if (!j->progress.compare_exchange_strong(expected, kRunning)) return;  // cancelled
        EncodeBuffers& buffers = *workers_[worker];
        const size_t before = buffers.bytes();
        try {
            run_encode(*j, buffers);
        } catch (...) {
            worker_bytes_ += buffers.bytes() - before;
            j->progress.store(kDone);
            throw;
        }
        worker_bytes_ += buffers.bytes() - before;
        j->held = j->blob.capacity();
        job_bytes_ += j->held;
        j->progress.store(kDone);
    });
    queue_peak_ = std::max(queue_peak_, queue_->outstanding());
}

// A chunk's frame holds [2][n_blocks * block_tokens][head_dim]: K, then V; or K only.
gear::Shape KvStore::chunk_shape(int n_blocks, bool k_only) const {
    gear::Shape shape;
    shape.ndim = 3;
    shape.dims[0] = k_only ? 1 : 2;
    shape.dims[1] = static_cast<uint32_t>(n_blocks * block_tokens_);
    shape.dims[2] = static_cast<uint32_t>(head_dim_);
    return shape;
}

// Encodes b.raw, a chunk of n_blocks (K only: its first half), into b.frame and decodes the
// frame back into b.check to compare (verify before free). Touches only b: safe on any thread.
KvStore::Encoded KvStore::encode_checked(EncodeBuffers& b, int n_blocks, bool k_only) const {
    const gear::Shape shape = chunk_shape(n_blocks, k_only);
    const size_t raw_size = chunk_raw_bytes(n_blocks) / (k_only ? 2 : 1);
    b.frame.resize(gear::max_encoded_size(element_type_, shape, 0));
    Encoded e;
    Clock::time_point t0 = Clock::now();
    const gear::Status s = cfg_.faults.encode_error
                               ? gear::Status::InvalidArgument
                               : b.codec.encode(b.raw.data(), element_type_, shape, b.frame.data(), b.frame.size(), &e.size);
    e.encode_us = micros_since(t0);
    e.encoded = s == gear::Status::Ok;
    if (!e.encoded) return e;
    t0 = Clock::now();
    b.check.resize(raw_size);
    e.verified = b.codec.decode(b.frame.data(), e.size, b.check.data(), raw_size) == gear::Status::Ok &&
                 std::memcmp(b.check.data(), b.raw.data(), raw_size) == 0 && !cfg_.faults.verify_mismatch;
    e.verify_us = micros_since(t0);
    return e;
}

// On a worker (or the caller without workers): reads the job's blocks, which stay unchanged
// until the job is settled, and writes only the job and its buffers.
void KvStore::run_encode(Job& job, EncodeBuffers& b) const {
    if (cfg_.faults.worker_exception) throw std::runtime_error("injected worker fault");
    const size_t half = job.raw_size / 2;
    b.raw.resize(job.raw_size);
    for (int j = 0; j < job.n_blocks; ++j) {
        std::memcpy(b.raw.data() + j * block_bytes_, job.k_src[j], block_bytes_);
        std::memcpy(b.raw.data() + half + j * block_bytes_, job.v_src[j], block_bytes_);
    }
    job.hash = xxh64(b.raw.data(), b.raw.size());
    const Encoded e = encode_checked(b, job.n_blocks, job.k_only);
    job.encoded = e.encoded;
    job.verified = e.verified;
    job.encode_us = e.encode_us;
    job.verify_us = e.verify_us;
    if (!job.encoded) return;
    // Only what the frame needs is kept while the job waits to be installed.
    job.blob.assign(b.frame.data(), b.frame.data() + e.size);
}

void KvStore::process(const WorkQueue::Completion& done) {
    auto it = jobs_.find(done.id);
    if (it == jobs_.end()) return;
    std::unique_ptr<Job> job = std::move(it->second);
    jobs_.erase(it);
    if (job->kind == Job::Kind::Encode) {
        if (job->progress.load() == kCancelled) return;  // its blocks were made raw again then
        job->failed = done.failed;
        finished_.push_back(std::move(job));
        return;
    }
    Chunk* chunk = job->chunk;
    if (!chunk) return;  // taken over by the caller
    chunk->prefetch = nullptr;
    --active_prefetches_;
    layer_stats_[job->layer].decode_us += job->decode_us;
    if (!done.failed && job->decoded_ok) {
        if (chunk->ref_width) gather_v(*chunk, job->dest->data);
        chunk->decoded = std::move(job->dest);
    } else {
        cache_bytes_ -= job->dest->size;
    }
}

void KvStore::install_finished() {
    if (queue_)
        for (const WorkQueue::Completion& c : queue_->collect()) process(c);
    for (auto& job : finished_) {
        job_bytes_ -= job->held;
        install(*job, job->failed);
    }
    finished_.clear();
}

void KvStore::install(Job& job, bool failed) {
    const int layer = job.layer;
    StoreLayerStats& st = layer_stats_[layer];
    HeadState& hs = state(layer, job.head);
    // A job whose head moved meanwhile: its blocks were made raw again then.
    const bool current = job.generation == hs.generation;
    const auto settle = [&] {
        if (current) std::fill(hs.state.begin() + job.first, hs.state.begin() + job.first + job.n_blocks, kSettled);
    };
    if (failed) {
        fallback(layer, StoreFallback::WorkerException);
        settle();
        return;
    }
    if (!job.encoded) {
        fallback(layer, StoreFallback::EncodeError);
        settle();
        return;
    }
    ++st.chunks_encoded;
    st.raw_bytes += static_cast<int64_t>(job.raw_size);
    st.compressed_bytes += static_cast<int64_t>(job.blob.size());
    st.encode_us += job.encode_us;
    st.verify_us += job.verify_us;
    KvHeadBlocks& kv = blocks(layer, job.head);
    const size_t half = job.raw_size / 2;
    bool same = job.verified;
    if (same && current && cfg_.mode != StoreMode::Probe) {
        // The blocks must still hold exactly the bytes that were encoded (verify before free; in
        // full mode, the check that the KV is untouched).
        std::vector<uint8_t>& live = own_->check;
        live.resize(job.raw_size);
        for (int j = 0; j < job.n_blocks; ++j) {
            std::memcpy(live.data() + j * block_bytes_, kv.k_blocks[job.first + j], block_bytes_);
            std::memcpy(live.data() + half + j * block_bytes_, kv.v_blocks[job.first + j], block_bytes_);
        }
        same = xxh64(live.data(), live.size()) == job.hash;
    }
    if (!same) {
        ++st.verify_mismatches;
        fallback(layer, StoreFallback::VerifyMismatch);
        settle();
        return;
    }
    if (cfg_.mode != StoreMode::Store) {
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
        fallback(layer, StoreFallback::Incompressible);
        settle();
        return;
    }
    auto chunk = std::make_unique<Chunk>();
    chunk->first = job.first;
    chunk->n_blocks = job.n_blocks;
    for (int j = 0; j < job.n_blocks; ++j) chunk->live.push_back(j);
    chunk->frame_size = job.blob.size();
    chunk->blob = std::move(job.blob);
    size_t table_growth = 0;
    if (job.k_only) {
        // own_->check still holds the blocks' bytes, checked against the job's hash above.
        const size_t rows_before = hs.table ? hs.table->size() : 0;
        if (!add_v_refs(layer, job.head, *chunk, own_->check.data() + half)) {
            settle();
            return;
        }
        table_growth = (hs.table->size() - rows_before) * row_bytes_;
        st.compressed_bytes += static_cast<int64_t>(chunk->blob.size() - chunk->frame_size + table_growth);
    }
    for (int j = job.first; j < job.first + job.n_blocks; ++j) {
        pool_.release(kv.k_blocks[j]);
        pool_.release(kv.v_blocks[j]);
        kv.k_blocks[j] = kv.v_blocks[j] = nullptr;
        hs.state[j] = kStored;
    }
    ++st.chunks_stored;
    st.stored_raw_bytes += static_cast<int64_t>(job.raw_size);
    st.stored_blob_bytes += static_cast<int64_t>(chunk->blob.size() + table_growth);
    blob_bytes_ += chunk->blob.capacity();
    ++stored_chunks_[layer];
    const auto at = std::upper_bound(hs.chunks.begin(), hs.chunks.end(), job.first,
                                     [](int first, const std::unique_ptr<Chunk>& c) { return first < c->first; });
    hs.chunks.insert(at, std::move(chunk));
}

// Store mode, a V dedup layer: interns the chunk's V rows (v: its n_blocks raw blocks of V) in
// the head's table, appends their indices to the blob and checks that the table gives back
// exactly these rows (verify before free). False, counted as a fallback, when memory cannot be
// had or the check fails; the chunk is then not installed (rows it added stay in the table,
// unreferenced, until the table's next compaction).
bool KvStore::add_v_refs(int layer, int h, Chunk& c, const uint8_t* v) {
    HeadState& hs = state(layer, h);
    const size_t n = static_cast<size_t>(c.n_blocks) * block_tokens_;
    try {
        if (cfg_.faults.alloc_failure) throw std::bad_alloc();
        if (!hs.table) hs.table = std::make_unique<RowTable>(row_bytes_);
        refs_.resize(n);
        for (size_t i = 0; i < n; ++i) refs_[i] = hs.table->intern(v + i * row_bytes_);
        const int width = hs.table->size() <= 65536 ? 2 : 4;
        std::vector<uint8_t> blob;
        blob.reserve(c.frame_size + n * width);  // exactly: the capacity is what is held
        blob.assign(c.blob.begin(), c.blob.begin() + static_cast<std::ptrdiff_t>(c.frame_size));
        blob.resize(c.frame_size + n * width);
        for (size_t i = 0; i < n; ++i) write_ref(blob.data() + c.frame_size + i * width, width, refs_[i]);
        c.blob.swap(blob);
        c.ref_width = width;
        c.table = hs.table.get();
    } catch (const std::bad_alloc&) {
        hs.dropped_refs += n;
        fallback(layer, StoreFallback::AllocFailure);
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(hs.table->row(refs_[i]), v + i * row_bytes_, row_bytes_) != 0 || cfg_.faults.verify_mismatch) {
            hs.dropped_refs += n;
            ++layer_stats_[layer].verify_mismatches;
            fallback(layer, StoreFallback::VerifyMismatch);
            return false;
        }
    }
    return true;
}

// A V dedup head drops references as chunks go or shrink; once it has dropped as many as half the
// rows the table holds (or has no chunk left), the rows no chunk refers to any more are removed
// and the references renumbered.
void KvStore::compact_table(int layer, int h) {
    HeadState& hs = state(layer, h);
    if (!hs.table || hs.dropped_refs == 0 || (!hs.chunks.empty() && hs.dropped_refs * 2 < hs.table->size())) return;
    std::vector<uint8_t> live(hs.table->size(), 0);
    std::vector<uint32_t> remap;
    try {
        for (const auto& c : hs.chunks) {
            const uint8_t* refs = c->blob.data() + c->frame_size;
            for (size_t i = 0, n = static_cast<size_t>(c->n_blocks) * block_tokens_; i < n; ++i)
                live[read_ref(refs + i * c->ref_width, c->ref_width)] = 1;
        }
        hs.table->compact(live, &remap);
    } catch (const std::bad_alloc&) {
        return;  // keeps the unreferenced rows; tried again after the next drop
    }
    for (const auto& c : hs.chunks) {
        uint8_t* refs = c->blob.data() + c->frame_size;
        for (size_t i = 0, n = static_cast<size_t>(c->n_blocks) * block_tokens_; i < n; ++i)
            write_ref(refs + i * c->ref_width, c->ref_width, remap[read_ref(refs + i * c->ref_width, c->ref_width)]);
    }
    hs.dropped_refs = 0;
}

void KvStore::drain() {
    if (queue_ && queue_->outstanding() > 0) {
        const Clock::time_point t0 = Clock::now();
        while (queue_->outstanding() > 0)
            for (const WorkQueue::Completion& c : queue_->wait_collect()) process(c);
        async_wait_us_ += micros_since(t0);
    }
    install_finished();
}

// --- reading frames -----------------------------------------------------------------------------

bool KvStore::decode_frame(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const {
    const size_t bytes = chunk_raw_bytes(chunk.n_blocks) / (chunk.ref_width ? 2 : 1);
    return codec.decode(chunk.blob.data(), chunk.frame_size, out, bytes) == gear::Status::Ok;
}

// V rows of a dedup chunk from its table; reads the table only (safe while nothing interns).
void KvStore::gather_v(const Chunk& chunk, uint8_t* out) const {
    uint8_t* v = out + static_cast<size_t>(chunk.n_blocks) * block_bytes_;
    const uint8_t* refs = chunk.blob.data() + chunk.frame_size;
    const int w = chunk.ref_width;
    for (size_t i = 0, n = static_cast<size_t>(chunk.n_blocks) * block_tokens_; i < n; ++i) {
        const uint32_t ref = read_ref(refs + i * w, w);
        if (ref >= chunk.table->size()) throw std::runtime_error("KvStore: a V row reference is out of range");
        std::memcpy(v + i * row_bytes_, chunk.table->row(ref), row_bytes_);
    }
}

void KvStore::decode_into(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const {
    if (!decode_frame(chunk, out, codec))
        throw std::runtime_error("KvStore: a verified frame no longer decodes (memory corrupted?)");
    if (chunk.ref_width) gather_v(chunk, out);
}

void KvStore::decode_into(int layer, const Chunk& chunk, uint8_t* out) {
    const Clock::time_point t0 = Clock::now();
    decode_into(chunk, out, own_->codec);
    layer_stats_[layer].decode_us += micros_since(t0);
}

void KvStore::finish_prefetch(int layer, Chunk& chunk) {
    Job* job = chunk.prefetch;
    int expected = kWaiting;
    if (job->progress.compare_exchange_strong(expected, kCancelled)) {
        // Not started yet: decode it here, into the room reserved for it.
        job->chunk = nullptr;
        chunk.prefetch = nullptr;
        --active_prefetches_;
        chunk.decoded = std::move(job->dest);
        decode_into(layer, chunk, chunk.decoded->data);
        ++layer_stats_[layer].cache_misses;
        return;
    }
    const Clock::time_point t0 = Clock::now();
    while (chunk.prefetch)
        for (const WorkQueue::Completion& c : queue_->wait_collect()) process(c);
    async_wait_us_ += micros_since(t0);
    if (chunk.decoded) ++layer_stats_[layer].cache_hits;
}

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
void KvStore::prepare_keys(int layer, int h, int key_begin, int key_end, ThreadPool* pool) {
    StoreLayerStats& st = layer_stats_[layer];
    const int first_block = key_begin / block_tokens_;
    const int end_block = (key_end + block_tokens_ - 1) / block_tokens_;
    const auto in_range = [&](const Chunk& c) {
        return c.first + static_cast<int>(c.live.size()) > first_block && c.first < end_block;
    };
    // Resolve what is decoded already; find the first chunk of the range that is not.
    HeadState& hs = state(layer, h);
    size_t start = hs.chunks.size();
    for (size_t i = 0; i < hs.chunks.size(); ++i) {
        Chunk& c = *hs.chunks[i];
        if (!in_range(c)) continue;
        if (c.prefetch) finish_prefetch(layer, c);
        else if (c.decoded) ++st.cache_hits;
        if (c.decoded) set_views(c, c.decoded->data);
        else if (c.batch == batch_) set_views(c, scratch_->data + c.batch_offset);
        else if (start == hs.chunks.size()) start = i;
    }
    if (start == hs.chunks.size()) return;

    // A new batch. The range's chunks of the old one (the old one's last: it ran in the same
    // order) move to the front of scratch instead of being decoded again.
    const uint64_t old_batch = batch_++;
    size_t carried_from = SIZE_MAX, used = 0;
    for (const auto& c : hs.chunks)
        if (c->batch == old_batch && in_range(*c) && c->batch_offset < carried_from) carried_from = c->batch_offset;
    if (carried_from != SIZE_MAX) used = batch_used_ - carried_from;
    pending_.clear();
    size_t need = used;
    // Candidates in the order the attention reads them: this head from `start`, then the next
    // heads. The range's chunks always join; the rest while the batch has room.
    for (int head = h; head < n_kv_heads_; ++head) {
        HeadState& s = state(layer, head);
        bool full = false;
        for (size_t i = head == h ? start : 0; i < s.chunks.size(); ++i) {
            Chunk& c = *s.chunks[i];
            if (c.decoded || c.prefetch || c.batch == old_batch) continue;
            const bool needed = head == h && in_range(c);
            const size_t bytes = chunk_raw_bytes(c.n_blocks);
            if (!needed && need + bytes > kDecodeBatchBytes) {
                full = true;
                break;
            }
            ++st.cache_misses;
            if (cache_bytes_ + bytes <= cfg_.decode_cache_bytes) {
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
        for (const auto& c : hs.chunks)
            if (c->batch == old_batch && in_range(*c)) {
                c->batch = batch_;
                c->batch_offset -= carried_from;
                set_views(*c, scratch_->data + c->batch_offset);
            }
    batch_used_ = need;
    for (Pending& d : pending_)
        if (!d.out) d.out = scratch_->data + d.chunk->batch_offset;

    const int n_threads = pool ? pool->size() : 1;
    while (static_cast<int>(decoders_.size()) + 1 < n_threads)
        decoders_.push_back(std::make_unique<gear::Codec>(codec_options(cfg_)));
    decode_us_.assign(static_cast<size_t>(n_threads), 0.0);
    const auto decode_one = [&](int i, int thread) {
        const Clock::time_point t0 = Clock::now();
        decode_into(*pending_[i].chunk, pending_[i].out, thread == 0 ? own_->codec : *decoders_[thread - 1]);
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
void KvStore::set_views(const Chunk& c, const uint8_t* base) {
    const size_t half = static_cast<size_t>(c.n_blocks) * block_bytes_;
    for (size_t j = 0; j < c.live.size(); ++j) {
        k_view_[c.first + j] = base + c.live[j] * block_bytes_;
        v_view_[c.first + j] = base + half + c.live[j] * block_bytes_;
    }
}

void KvStore::attend(int layer, const AttentionProblem& p, Isa isa, ThreadPool* pool, AttentionWorkspace& ws) {
    const int G = p.group, hd = p.head_dim, n_heads = p.n_kv_heads * G;
    int split_keys = 0;
    for (int h = 0; h < p.n_kv_heads; ++h) split_keys = std::max(split_keys, p.heads[h].n_keys);
    const size_t group_floats = static_cast<size_t>(G) * hd;
    q_head_.resize(static_cast<size_t>(p.n_q) * group_floats);
    out_head_.resize(q_head_.size());
    ++batch_;  // a new layer: nothing of it is in scratch yet
    batch_used_ = 0;
    for (int h = 0; h < p.n_kv_heads; ++h) {
        const KvHeadBlocks& kv = blocks(layer, h);
        // Compressed blocks are null in the lists; prepare_keys() points them at decoded bytes.
        k_view_.assign(kv.k_blocks.begin(), kv.k_blocks.end());
        v_view_.assign(kv.v_blocks.begin(), kv.v_blocks.end());
        struct Source final : KeySource {
            KvStore* store;
            int layer, head;
            ThreadPool* pool;
            void prepare(int, int key_begin, int key_end) override {
                store->prepare_keys(layer, head, key_begin, key_end, pool);
            }
        } source;
        source.store = this;
        source.layer = layer;
        source.head = h;
        source.pool = pool;
        KvHeadView view;
        view.k_blocks = k_view_.data();
        view.v_blocks = v_view_.data();
        view.n_keys = p.heads[h].n_keys;
        for (int t = 0; t < p.n_q; ++t)
            std::memcpy(q_head_.data() + t * group_floats, p.q + (static_cast<size_t>(t) * n_heads + h * G) * hd,
                        group_floats * sizeof(float));
        AttentionProblem one = p;
        one.n_kv_heads = 1;
        one.heads = &view;
        one.q = q_head_.data();
        one.out = out_head_.data();
        one.block_scores = p.block_scores ? p.block_scores + static_cast<size_t>(h) * p.scores_stride : nullptr;
        one.window_scores = p.window_scores ? p.window_scores + static_cast<size_t>(h) * p.scores_stride : nullptr;
        one.split_keys = split_keys;
        attention(one, isa, pool, ws, &source);
        for (int t = 0; t < p.n_q; ++t)
            std::memcpy(p.out + (static_cast<size_t>(t) * n_heads + h * G) * hd, out_head_.data() + t * group_floats,
                        group_floats * sizeof(float));
    }
}

void KvStore::prefetch(int layer) {
    if (cfg_.mode != StoreMode::Store || !cfg_.prefetch || !queue_ || layer < 0 || layer >= n_layers_ ||
        stored_chunks_[layer] == 0)
        return;
    for (int h = 0; h < n_kv_heads_; ++h) {
        for (const auto& c : state(layer, h).chunks) {
            if (c->decoded || c->prefetch) continue;
            const size_t bytes = chunk_raw_bytes(c->n_blocks);
            if (cache_bytes_ + bytes > cfg_.decode_cache_bytes || queue_->outstanding() >= queue_->capacity()) return;
            auto job = std::make_unique<Job>();
            job->kind = Job::Kind::Prefetch;
            job->layer = layer;
            job->head = h;
            job->chunk = c.get();
            job->dest = std::make_unique<AlignedBytes>(bytes);
            Job* j = job.get();
            const uint64_t id = next_job_++;
            jobs_.emplace(id, std::move(job));
            cache_bytes_ += bytes;
            c->prefetch = j;
            ++active_prefetches_;
            queue_->try_submit(id, [this, j](int worker) {
                int expected = kWaiting;
                if (!j->progress.compare_exchange_strong(expected, kRunning)) return;  // the caller took it
                const Clock::time_point t0 = Clock::now();
                // The frame only: the caller adds a dedup chunk's V rows, since it may be growing
                // the table meanwhile.
                j->decoded_ok = decode_frame(*j->chunk, j->dest->data, workers_[worker]->codec);
                j->decode_us = micros_since(t0);
                j->progress.store(kDone);
            });
            queue_peak_ = std::max(queue_peak_, queue_->outstanding());
        }
    }
}

// Before chunks change: no prefetch may still read a frame or fill an entry.
void KvStore::settle_prefetches() {
    if (active_prefetches_ == 0) return;
    for (auto& entry : jobs_) {
        Job& job = *entry.second;
        if (job.kind != Job::Kind::Prefetch || !job.chunk) continue;
        int expected = kWaiting;
        if (!job.progress.compare_exchange_strong(expected, kCancelled)) continue;
        cache_bytes_ -= job.dest->size;
        job.dest.reset();
        job.chunk->prefetch = nullptr;
        job.chunk = nullptr;
        --active_prefetches_;
    }
    const Clock::time_point t0 = Clock::now();
    while (active_prefetches_ > 0)
        for (const WorkQueue::Completion& c : queue_->wait_collect()) process(c);
    async_wait_us_ += micros_since(t0);
}

// Before a head's blocks may be released or written: its encode jobs that have not started are
// cancelled (their blocks go back to raw) and the running ones, which read the blocks in place,
// are waited for.
void KvStore::settle_encodes(int layer, int h) {
    if (!queue_) return;
    const auto reading = [&](Job& job) {
        return job.kind == Job::Kind::Encode && job.layer == layer && job.head == h && job.progress.load() == kRunning;
    };
    bool running = false;
    for (auto& entry : jobs_) {
        Job& job = *entry.second;
        if (job.kind != Job::Kind::Encode || job.layer != layer || job.head != h) continue;
        int expected = kWaiting;
        if (!job.progress.compare_exchange_strong(expected, kCancelled)) running |= expected == kRunning;
    }
    if (!running) return;
    const Clock::time_point t0 = Clock::now();
    for (;;) {
        bool any = false;
        for (auto& entry : jobs_) any |= reading(*entry.second);
        if (!any) break;
        for (const WorkQueue::Completion& c : queue_->wait_collect()) process(c);
    }
    async_wait_us_ += micros_since(t0);
}

void KvStore::read_block(int layer, int h, int block, const void** k, const void** v) {
    HeadState& hs = state(layer, h);
    settle_prefetches();
    for (const auto& c : hs.chunks) {
        if (block < c->first || block >= c->first + static_cast<int>(c->live.size())) continue;
        const uint8_t* base;
        if (c->decoded) {
            base = c->decoded->data;
        } else {
            const size_t bytes = chunk_raw_bytes(c->n_blocks);
            if (read_chunk_ != c.get()) {
                if (!read_buf_ || read_buf_->size < bytes) read_buf_ = std::make_unique<AlignedBytes>(bytes);
                decode_into(layer, *c, read_buf_->data);
                read_chunk_ = c.get();
            }
            base = read_buf_->data;
        }
        const size_t frame_block = static_cast<size_t>(c->live[block - c->first]);
        *k = base + frame_block * block_bytes_;
        *v = base + static_cast<size_t>(c->n_blocks) * block_bytes_ + frame_block * block_bytes_;
        return;
    }
    throw std::logic_error("KvStore: block is not compressed");
}

// --- taking frames apart ------------------------------------------------------------------------

bool KvStore::dissolve(int layer, int h, Chunk& chunk, const std::vector<uint8_t>* keep) {
    KvHeadBlocks& kv = blocks(layer, h);
    HeadState& hs = state(layer, h);
    const auto wanted = [&](size_t j) { return !keep || (*keep)[chunk.first + j]; };
    std::vector<void*> got;  // K, V of each wanted block
    if (cfg_.faults.alloc_failure) {
        fallback(layer, StoreFallback::AllocFailure);
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
        fallback(layer, StoreFallback::AllocFailure);
        return false;
    }
    const uint8_t* base;
    if (chunk.decoded) {
        base = chunk.decoded->data;
    } else {
        std::vector<uint8_t>& decoded = own_->check;
        decoded.resize(chunk_raw_bytes(chunk.n_blocks));
        decode_into(layer, chunk, decoded.data());
        base = decoded.data();
    }
    const size_t half = static_cast<size_t>(chunk.n_blocks) * block_bytes_;
    for (size_t j = 0, g = 0; j < chunk.live.size(); ++j) {
        if (!wanted(j)) continue;
        const size_t at = chunk.first + j, from = static_cast<size_t>(chunk.live[j]) * block_bytes_;
        std::memcpy(got[g], base + from, block_bytes_);
        std::memcpy(got[g + 1], base + half + from, block_bytes_);
        kv.k_blocks[at] = got[g];
        kv.v_blocks[at] = got[g + 1];
        hs.state[at] = kRaw;
        g += 2;
    }
    ++layer_stats_[layer].dissolved;
    return true;
}

// Encodes the caller's buffer own_->raw, n blocks, for a chunk re-encoded in place. The result
// counts as verified only when the frame decoded back exactly and is smaller than limit bytes;
// errors are counted as fallbacks.
KvStore::Encoded KvStore::reencode(int layer, int n, bool k_only, size_t limit) {
    StoreLayerStats& st = layer_stats_[layer];
    Encoded e = encode_checked(*own_, n, k_only);
    st.encode_us += e.encode_us;
    st.verify_us += e.verify_us;
    if (!e.encoded) {
        fallback(layer, StoreFallback::EncodeError);
    } else if (e.size < limit && !e.verified) {
        ++st.verify_mismatches;
        fallback(layer, StoreFallback::VerifyMismatch);
    }
    e.verified = e.verified && e.encoded && e.size < limit;
    return e;
}

// H2O trims a few blocks off many chunks at every update. Dissolving them would hand the
// survivors raw blocks until they are encoded again (and H2O trims again soon after); instead the
// survivors are re-encoded here, from the frame, into a smaller frame that replaces it once it
// decodes back exactly. False (chunk unchanged) when that fails or does not compress.
bool KvStore::repack(int layer, int h, Chunk& c, const std::vector<uint8_t>& keep) {
    EncodeBuffers& b = *own_;
    const uint8_t* base;
    if (c.decoded) {
        base = c.decoded->data;
    } else {
        b.check.resize(chunk_raw_bytes(c.n_blocks));
        decode_into(layer, c, b.check.data());
        base = b.check.data();
    }
    int n = 0;
    for (size_t j = 0; j < c.live.size(); ++j) n += keep[c.first + j] ? 1 : 0;
    const size_t old_half = static_cast<size_t>(c.n_blocks) * block_bytes_;
    const size_t half = static_cast<size_t>(n) * block_bytes_;
    b.raw.resize(2 * half);
    for (size_t j = 0, g = 0; j < c.live.size(); ++j) {
        if (!keep[c.first + j]) continue;
        const size_t from = static_cast<size_t>(c.live[j]) * block_bytes_;
        std::memcpy(b.raw.data() + g * block_bytes_, base + from, block_bytes_);
        std::memcpy(b.raw.data() + half + g * block_bytes_, base + old_half + from, block_bytes_);
        ++g;
    }
    StoreLayerStats& st = layer_stats_[layer];
    const bool k_only = c.ref_width > 0;
    const Encoded e = reencode(layer, n, k_only, k_only ? half : b.raw.size());
    if (!e.verified) return false;
    // A dedup chunk keeps the references of its surviving rows (the table is unchanged).
    const int w = c.ref_width;
    const size_t block_refs = static_cast<size_t>(block_tokens_) * w;
    std::vector<uint8_t> blob;
    try {
        if (cfg_.faults.alloc_failure) throw std::bad_alloc();
        blob.reserve(e.size + n * block_refs);
        blob.assign(b.frame.data(), b.frame.data() + e.size);
        for (size_t j = 0; j < c.live.size() && w; ++j) {
            if (!keep[c.first + j]) continue;
            const uint8_t* refs = c.blob.data() + c.frame_size + static_cast<size_t>(c.live[j]) * block_refs;
            blob.insert(blob.end(), refs, refs + block_refs);
        }
    } catch (const std::bad_alloc&) {
        fallback(layer, StoreFallback::AllocFailure);
        return false;
    }
    if (w) state(layer, h).dropped_refs += static_cast<size_t>(c.n_blocks - n) * block_tokens_;
    replace_frame(layer, c, std::move(blob), e.size, n);
    ++st.repacked;
    return true;
}

// c's frame becomes blob (a frame of n blocks in blob[0, frame_size), then any row references),
// made from the caller's buffers; its cache entry goes.
void KvStore::replace_frame(int layer, Chunk& c, std::vector<uint8_t>&& blob, size_t frame_size, int n) {
    blob_bytes_ += blob.capacity();
    blob_bytes_ -= c.blob.capacity();
    c.blob = std::move(blob);
    c.frame_size = frame_size;
    if (c.decoded) {
        cache_bytes_ -= c.decoded->size;
        c.decoded.reset();
    }
    if (read_chunk_ == &c) read_chunk_ = nullptr;
    c.n_blocks = n;
    c.live.resize(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) c.live[j] = j;
    StoreLayerStats& st = layer_stats_[layer];
    ++st.chunks_encoded;
    st.raw_bytes += static_cast<int64_t>(chunk_raw_bytes(n));
    st.compressed_bytes += static_cast<int64_t>(c.blob.size());
    st.stored_raw_bytes += static_cast<int64_t>(chunk_raw_bytes(n));
    st.stored_blob_bytes += static_cast<int64_t>(c.blob.size());
}

// H2O trims chunks a block or two at a time, and small frames compress worse (on SmolLM2 KV:
// 1.171x at 64 tokens, 1.188x at 128, where the rANS tables per channel group start to pay). So
// after a compaction, neighbouring chunks (adjacent in the head, nothing raw between them) whose
// live blocks fit one chunk together are re-encoded into one frame, which replaces both once it
// decodes back exactly. V dedup chunks are left as they are.
void KvStore::merge_neighbours(int layer, int h) {
    HeadState& hs = state(layer, h);
    for (size_t i = 0; i + 1 < hs.chunks.size();) {
        Chunk& a = *hs.chunks[i];
        const Chunk& b = *hs.chunks[i + 1];
        const int na = static_cast<int>(a.live.size()), nb = static_cast<int>(b.live.size());
        if (a.first + na != b.first || na + nb > blocks_per_chunk_ || a.ref_width || b.ref_width || !merge(layer, a, b)) {
            ++i;
            continue;
        }
        drop_chunk(layer, h, i + 1);  // a now holds b's blocks too: try a with the next one
    }
}

// Encodes a's live blocks followed by b's into one frame that replaces a's. False (nothing
// changed) when that fails or is not smaller than the two frames.
bool KvStore::merge(int layer, Chunk& a, const Chunk& b) {
    EncodeBuffers& buf = *own_;
    const int na = static_cast<int>(a.live.size()), n = na + static_cast<int>(b.live.size());
    const size_t half = static_cast<size_t>(n) * block_bytes_;
    buf.raw.resize(2 * half);
    int at = 0;
    for (const Chunk* c : {static_cast<const Chunk*>(&a), &b}) {
        const uint8_t* base;
        if (c->decoded) {
            base = c->decoded->data;
        } else {
            buf.check.resize(chunk_raw_bytes(c->n_blocks));
            decode_into(layer, *c, buf.check.data());
            base = buf.check.data();
        }
        const size_t c_half = static_cast<size_t>(c->n_blocks) * block_bytes_;
        for (int j : c->live) {
            std::memcpy(buf.raw.data() + at * block_bytes_, base + j * block_bytes_, block_bytes_);
            std::memcpy(buf.raw.data() + half + at * block_bytes_, base + c_half + j * block_bytes_, block_bytes_);
            ++at;
        }
    }
    StoreLayerStats& st = layer_stats_[layer];
    const Encoded e = reencode(layer, n, false, a.blob.size() + b.blob.size());
    if (!e.verified) return false;
    std::vector<uint8_t> blob;
    try {
        if (cfg_.faults.alloc_failure) throw std::bad_alloc();
        blob.assign(buf.frame.data(), buf.frame.data() + e.size);
    } catch (const std::bad_alloc&) {
        fallback(layer, StoreFallback::AllocFailure);
        return false;
    }
    replace_frame(layer, a, std::move(blob), e.size, n);
    ++st.merged;
    return true;
}

void KvStore::drop_chunk(int layer, int h, size_t index) {
    HeadState& hs = state(layer, h);
    Chunk& c = *hs.chunks[index];
    if (c.ref_width) hs.dropped_refs += static_cast<size_t>(c.n_blocks) * block_tokens_;
    if (c.decoded) cache_bytes_ -= c.decoded->size;
    blob_bytes_ -= c.blob.capacity();
    if (read_chunk_ == &c) read_chunk_ = nullptr;
    --stored_chunks_[layer];
    hs.chunks.erase(hs.chunks.begin() + static_cast<std::ptrdiff_t>(index));
}

void KvStore::requeue(HeadState& hs) {
    for (uint8_t& s : hs.state)
        if (s == kQueued) s = kRaw;
    ++hs.generation;
}

void KvStore::compact(int layer, int h, const std::vector<TokenRun>& runs, bool block_aligned) {
    settle_prefetches();
    settle_encodes(layer, h);
    HeadState& hs = state(layer, h);
    const KvHeadBlocks& kv = blocks(layer, h);
    const size_t n_blocks = kv.k_blocks.size();
    hs.state.resize(n_blocks, kRaw);
    requeue(hs);
    if (!block_aligned) {
        // Rows will move across block boundaries: the whole head goes back to raw first.
        while (!hs.chunks.empty()) {
            if (!dissolve(layer, h, *hs.chunks.back(), nullptr)) throw std::bad_alloc();
            drop_chunk(layer, h, hs.chunks.size() - 1);
        }
        std::fill(hs.state.begin(), hs.state.end(), kRaw);  // moved rows make new blocks
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
    for (size_t i = 0; i < hs.chunks.size();) {
        Chunk& c = *hs.chunks[i];
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
        if (keep_[b]) hs.state[w++] = hs.state[b];
    hs.state.resize(w);
    merge_neighbours(layer, h);
    compact_table(layer, h);
}

void KvStore::truncate(int layer, int h, int n_tokens) {
    settle_prefetches();
    settle_encodes(layer, h);
    HeadState& hs = state(layer, h);
    const KvHeadBlocks& kv = blocks(layer, h);
    hs.state.resize(kv.k_blocks.size(), kRaw);
    const int keep_blocks = (n_tokens + block_tokens_ - 1) / block_tokens_;
    const int whole_blocks = n_tokens / block_tokens_;  // blocks left full and unchanged
    keep_.assign(kv.k_blocks.size(), 0);
    std::fill(keep_.begin(), keep_.begin() + keep_blocks, 1);
    for (size_t i = hs.chunks.size(); i-- > 0;) {
        Chunk& c = *hs.chunks[i];
        if (c.first + static_cast<int>(c.live.size()) <= whole_blocks) continue;
        // A chunk reaching the block that appends will write into must be raw again.
        if (c.first < keep_blocks && !dissolve(layer, h, c, &keep_)) throw std::bad_alloc();
        drop_chunk(layer, h, i);
    }
    requeue(hs);
    hs.state.resize(std::min(hs.state.size(), static_cast<size_t>(keep_blocks)));
    compact_table(layer, h);
}

void KvStore::dissolve_all() {
    drain();
    settle_prefetches();
    for (int layer = 0; layer < n_layers_; ++layer) {
        for (int h = 0; h < n_kv_heads_; ++h) {
            HeadState& hs = state(layer, h);
            while (!hs.chunks.empty()) {
                if (!dissolve(layer, h, *hs.chunks.back(), nullptr)) throw std::bad_alloc();
                drop_chunk(layer, h, hs.chunks.size() - 1);
            }
            hs.table.reset();
            hs.dropped_refs = 0;
        }
    }
}

void KvStore::reset() {
    // Cancels the queued jobs and waits for the running ones; a fresh queue takes new work.
    queue_.reset();
    jobs_.clear();
    finished_.clear();
    active_prefetches_ = 0;
    for (HeadState& hs : states_) {
        hs.chunks.clear();
        hs.state.clear();
        hs.table.reset();
        hs.dropped_refs = 0;
        ++hs.generation;
    }
    std::fill(stored_chunks_.begin(), stored_chunks_.end(), 0);
    std::fill(layer_stats_.begin(), layer_stats_.end(), StoreLayerStats{});
    async_wait_us_ = 0.0;
    queue_peak_ = 0;
    deferrals_ = stale_jobs_ = candidates_ = 0;
    blob_bytes_ = cache_bytes_ = job_bytes_ = 0;
    scratch_.reset();
    scratch_need_ = 0;
    read_buf_.reset();
    read_chunk_ = nullptr;
    for (auto& b : workers_) b = std::make_unique<EncodeBuffers>(codec_options(cfg_));
    own_ = std::make_unique<EncodeBuffers>(codec_options(cfg_));
    worker_bytes_ = 0;
    if (cfg_.async_threads > 0) queue_ = std::make_unique<WorkQueue>(cfg_.async_threads, cfg_.max_queue);
}

// --- accounting ---------------------------------------------------------------------------------

size_t KvStore::bytes_held() const {
    // Workers' own buffers (their codec scratch) are not counted: reading them would race.
    return blob_bytes_ + table_bytes() + cache_bytes_ + job_bytes_ + worker_bytes_ + own_->bytes() +
           (scratch_ ? scratch_->size : 0) + (read_buf_ ? read_buf_->size : 0);
}

size_t KvStore::table_bytes(int layer) const {
    size_t bytes = 0;
    for (int h = 0; h < n_kv_heads_; ++h) {
        const HeadState& hs = states_[static_cast<size_t>(layer) * n_kv_heads_ + h];
        if (hs.table) bytes += hs.table->bytes();
    }
    return bytes;
}

size_t KvStore::table_bytes() const {
    size_t bytes = 0;
    for (int layer = 0; layer < std::min(cfg_.v_dedup_layers, n_layers_); ++layer) bytes += table_bytes(layer);
    return bytes;
}

StoreStats KvStore::stats() const {
    StoreStats s;
    s.mode = cfg_.mode;
    s.layers.resize(static_cast<size_t>(n_layers_));
    for (int layer = 0; layer < n_layers_; ++layer) {
        StoreStats::Layer& l = s.layers[layer];
        l.counters = layer_stats_[layer];
        for (int h = 0; h < n_kv_heads_; ++h)
            for (const auto& c : states_[static_cast<size_t>(layer) * n_kv_heads_ + h].chunks) {
                ++l.chunks_held;
                l.blob_bytes += c->blob.capacity();
                l.held_raw_bytes += chunk_raw_bytes(static_cast<int>(c->live.size()));
            }
        l.table_bytes = table_bytes(layer);
        s.table_bytes += l.table_bytes;
        add(s.total, l.counters);
        s.chunks_held += l.chunks_held;
        s.held_raw_bytes += l.held_raw_bytes;
    }
    // Store mode: what the chunks held now stand for over what they hold (a chunk re-encoded five
    // times counts once); the modes that hold nothing: over everything encoded.
    const bool stored = cfg_.mode == StoreMode::Store;
    const double raw = stored ? static_cast<double>(s.held_raw_bytes) : static_cast<double>(s.total.raw_bytes);
    const double packed = stored ? static_cast<double>(blob_bytes_ + s.table_bytes) : static_cast<double>(s.total.compressed_bytes);
    if (raw > 0 && packed > 0) s.lossless_ratio = raw / packed;
    s.async_wait_us = async_wait_us_;
    s.queue_peak = queue_peak_;
    s.deferrals = deferrals_;
    s.stale_jobs = stale_jobs_;
    s.blob_bytes = blob_bytes_;
    s.cache_bytes = cache_bytes_;
    s.scratch_bytes = bytes_held() - blob_bytes_ - s.table_bytes - cache_bytes_;
    return s;
}

}  // namespace mnn_h2o
