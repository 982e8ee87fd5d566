#include "mnn_h2o/store/store_jobs.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mnn_h2o/store/store_clock.h"
#include "mnn_h2o/codec/xxhash64.h"

namespace mnn_h2o::store {

void run_encode(const ChunkCodec& codec, Job& job, EncodeBuffers& b, bool fail) {
    if (fail) throw std::runtime_error("injected worker fault");
    const size_t block_bytes = codec.block_bytes(), half = job.raw_size / 2;
    b.raw.resize(job.raw_size);
    for (int j = 0; j < job.n_blocks; ++j) {
        std::memcpy(b.raw.data() + j * block_bytes, job.k_src[j], block_bytes);
        std::memcpy(b.raw.data() + half + j * block_bytes, job.v_src[j], block_bytes);
    }
    job.hash = xxh64(b.raw.data(), b.raw.size());
    const Encoded e = codec.encode_checked(b, job.n_blocks, job.k_only);
    job.encoded = e.encoded;
    job.verified = e.verified;
    job.encode_us = e.encode_us;
    job.verify_us = e.verify_us;
    if (!job.encoded) return;
    // Only what the frame needs is kept while the job waits to be installed.
    job.blob.assign(b.frame.data(), b.frame.data() + e.size);
}

StoreJobs::StoreJobs(const StoreConfig& config, const ChunkCodec& codec, PrefetchDone prefetch_done)
    : cfg_(config), codec_(codec), prefetch_done_(std::move(prefetch_done)) {
    if (cfg_.async_threads > 0) {
        for (int t = 0; t < cfg_.async_threads; ++t) workers_.push_back(codec_.buffers());
        queue_ = std::make_unique<WorkQueue>(cfg_.async_threads, cfg_.max_queue);
    }
}

StoreJobs::~StoreJobs() {
    queue_.reset();  // workers stop before the jobs and frames they read go
}

void StoreJobs::submit(std::unique_ptr<Job> job) {
    Job* j = job.get();
    const uint64_t id = next_id_++;
    jobs_.emplace(id, std::move(job));
    // Cannot be refused: only this thread submits, and it checked the room.
    if (j->kind == Job::Kind::Encode) {
        queue_->try_submit(id, [this, j](int worker) {
            int expected = kWaiting;
            if (!j->progress.compare_exchange_strong(expected, kRunning)) return;  // cancelled
            EncodeBuffers& buffers = *workers_[worker];
            const size_t before = buffers.bytes();
            try {
                run_encode(codec_, *j, buffers, cfg_.faults.worker_exception);
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
    } else {
        queue_->try_submit(id, [this, j](int worker) {
            int expected = kWaiting;
            if (!j->progress.compare_exchange_strong(expected, kRunning)) return;  // the caller took it
            const Clock::time_point t0 = Clock::now();
            // The frame only: the caller adds a dedup chunk's V rows, since it may be growing
            // the table meanwhile.
            j->decoded_ok = codec_.decode_frame(*j->chunk, j->dest->data, *workers_[worker]->codec);
            j->decode_us = micros_since(t0);
            j->progress.store(kDone);
        });
    }
    peak_ = std::max(peak_, queue_->outstanding());
}

void StoreJobs::process(const WorkQueue::Completion& done) {
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
    if (job->chunk) prefetch_done_(*job, done.failed);  // else taken over by the caller
}

void StoreJobs::collect() {
    if (queue_)
        for (const WorkQueue::Completion& c : queue_->collect()) process(c);
}

void StoreJobs::wait_until(const std::function<bool()>& done) {
    const Clock::time_point t0 = Clock::now();
    while (!done())
        for (const WorkQueue::Completion& c : queue_->wait_collect()) process(c);
    wait_us_ += micros_since(t0);
}

void StoreJobs::drain() {
    if (queue_ && queue_->outstanding() > 0) wait_until([&] { return queue_->outstanding() == 0; });
}

void StoreJobs::settle_encodes(int layer, int head) {
    if (!queue_) return;
    const auto reading = [&](const Job& job) {
        return job.kind == Job::Kind::Encode && job.layer == layer && job.head == head && job.progress.load() == kRunning;
    };
    bool running = false;
    for (auto& entry : jobs_) {
        Job& job = *entry.second;
        if (job.kind != Job::Kind::Encode || job.layer != layer || job.head != head) continue;
        int expected = kWaiting;
        if (!job.progress.compare_exchange_strong(expected, kCancelled)) running |= expected == kRunning;
    }
    if (!running) return;
    wait_until([&] {
        for (auto& entry : jobs_)
            if (reading(*entry.second)) return false;
        return true;
    });
}

void StoreJobs::cancel_waiting_prefetches(const std::function<void(Job&)>& cancelled) {
    for (auto& entry : jobs_) {
        Job& job = *entry.second;
        if (job.kind != Job::Kind::Prefetch || !job.chunk) continue;
        int expected = kWaiting;
        if (job.progress.compare_exchange_strong(expected, kCancelled)) cancelled(job);
    }
}

std::vector<std::unique_ptr<Job>> StoreJobs::take_finished() {
    std::vector<std::unique_ptr<Job>> taken;
    taken.swap(finished_);
    for (const auto& job : taken) job_bytes_ -= job->held;
    return taken;
}

void StoreJobs::reset() {
    // Cancels the queued jobs and waits for the running ones; a fresh queue takes new work.
    queue_.reset();
    jobs_.clear();
    finished_.clear();
    for (auto& b : workers_) b->release();
    job_bytes_ = worker_bytes_ = 0;
    wait_us_ = 0.0;
    peak_ = 0;
    if (cfg_.async_threads > 0) queue_ = std::make_unique<WorkQueue>(cfg_.async_threads, cfg_.max_queue);
}

}  // namespace mnn_h2o::store
