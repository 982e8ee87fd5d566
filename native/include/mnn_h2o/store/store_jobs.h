// The store's work on its workers (work_queue.h): encode jobs that turn a cold chunk's blocks
// into a checked frame, and prefetch jobs that decode a held chunk's frame into room reserved in
// the decode cache. The caller submits, collects, cancels and waits on its own thread; a worker
// only ever sees its job's fields and, for a prefetch, a frame that stays alive and unchanged
// until the job is settled (docs/kv_cache.md "Async").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/store/store_chunk.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/runtime/work_queue.h"

namespace mnn_h2o::store {

// A job's progress; the caller may take a job over (prefetch) or cancel it (encode) before a
// worker starts it.
enum JobProgress : int { kWaiting = 0, kRunning, kCancelled, kDone };

struct Job {
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
    size_t held = 0;  // blob bytes counted in StoreJobs::bytes() until the job is taken
    uint64_t hash = 0;
    bool encoded = false, verified = false, failed = false;
    double encode_us = 0.0, verify_us = 0.0;
    // Prefetch: decodes chunk's frame into dest, the room reserved for it in the cache.
    Chunk* chunk = nullptr;  // null once the caller has taken the job over
    std::unique_ptr<AlignedBytes> dest;
    bool decoded_ok = false;
    double decode_us = 0.0;
};

// An encode job's work, on a worker or on the caller's thread without workers: reads the job's
// blocks, which stay unchanged until the job is settled, and writes only the job and b.
// fail: the injected worker fault (throws).
void run_encode(const ChunkCodec& codec, Job& job, EncodeBuffers& b, bool fail);

class StoreJobs {
public:
    // A prefetch job finished (failed: it threw) and the caller had not taken it over; called on
    // the caller's thread while collecting.
    using PrefetchDone = std::function<void(Job& job, bool failed)>;

    // No workers when config.async_threads is 0: then nothing may be submitted.
    StoreJobs(const StoreConfig& config, const ChunkCodec& codec, PrefetchDone prefetch_done);
    ~StoreJobs();  // cancels queued jobs and joins the workers
    StoreJobs(const StoreJobs&) = delete;
    StoreJobs& operator=(const StoreJobs&) = delete;

    bool async() const { return queue_ != nullptr; }
    bool full() const { return queue_ && queue_->outstanding() >= queue_->capacity(); }
    // Queues a job; the caller has checked that the queue is not full.
    void submit(std::unique_ptr<Job> job);

    // Handles the jobs that have completed, without waiting.
    void collect();
    // Handles completions until done() holds (which some outstanding job must bring about);
    // the time counts as waiting.
    void wait_until(const std::function<bool()>& done);
    // Waits for every job.
    void drain();
    // Before a head's blocks may be released or written: its encode jobs that have not started
    // are cancelled (their blocks are raw again) and the running ones waited for.
    void settle_encodes(int layer, int head);
    // Cancels every prefetch job no worker has started; cancelled(job) gives back its room.
    void cancel_waiting_prefetches(const std::function<void(Job&)>& cancelled);
    // The encode jobs completed and not cancelled, in completion order, to be installed.
    std::vector<std::unique_ptr<Job>> take_finished();

    // Cancels queued jobs, waits for running ones, frees every buffer; fresh workers follow.
    void reset();

    // Frames of finished jobs not yet taken, and the workers' encode buffers (not their codecs'
    // own scratch: reading that would race).
    size_t bytes() const { return job_bytes_ + worker_bytes_; }
    double wait_us() const { return wait_us_; }
    int peak() const { return peak_; }

private:
    void process(const WorkQueue::Completion& done);

    const StoreConfig cfg_;
    const ChunkCodec& codec_;
    const PrefetchDone prefetch_done_;
    double wait_us_ = 0.0;
    int peak_ = 0;
    uint64_t next_id_ = 1;
    // Written by workers: frames of finished jobs not yet taken, and the workers' buffers.
    std::atomic<size_t> job_bytes_{0}, worker_bytes_{0};
    std::vector<std::unique_ptr<EncodeBuffers>> workers_;      // [worker]
    std::unordered_map<uint64_t, std::unique_ptr<Job>> jobs_;  // submitted, not yet processed
    std::vector<std::unique_ptr<Job>> finished_;               // processed encode jobs
    std::unique_ptr<WorkQueue> queue_;  // last: joined before anything its jobs point to goes
};

}  // namespace mnn_h2o::store
