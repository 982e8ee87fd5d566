// Background workers for the KV store (lossless_stage.h): N threads taking jobs from a bounded FIFO.
//
// Unlike ThreadPool (a fork/join over the caller's own work), jobs here run while the caller goes
// on with other work, and their results are collected later at a point the caller chooses. The
// bound counts every job from submission until its completion is collected, so the memory the
// jobs hold (their copies of the data) stays bounded and a caller that never collects cannot
// pile up work. Idle workers sleep on a condition variable (no spinning; see thread_pool.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "mnn_h2o/runtime/worker_threads.h"

namespace mnn_h2o {

class WorkQueue {
public:
    // A job gets the index of the worker running it, in [0, n_threads): per-worker scratch.
    using Job = std::function<void(int worker)>;
    struct Completion {
        uint64_t id = 0;
        bool failed = false;  // the job threw; error holds what()
        std::string error;
    };

    // Throws std::invalid_argument unless n_threads >= 1 and capacity >= 1.
    WorkQueue(int n_threads, int capacity);
    // Drops the jobs not started yet, waits for the running ones and joins every worker.
    ~WorkQueue();
    WorkQueue(const WorkQueue&) = delete;
    WorkQueue& operator=(const WorkQueue&) = delete;

    int threads() const { return workers_.size(); }
    int capacity() const { return capacity_; }

    // Queues job under id; false (job not taken) when capacity jobs are outstanding: queued,
    // running, or finished but not collected.
    bool try_submit(uint64_t id, Job job);
    // The jobs finished since the last collection, in completion order; never blocks.
    std::vector<Completion> collect();
    // Like collect(), but first waits until at least one job has finished (returns at once,
    // empty, when nothing is outstanding).
    std::vector<Completion> wait_collect();
    int outstanding() const;

private:
    void worker_loop(int worker);

    const int capacity_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;      // workers: a job was queued, or stop
    std::condition_variable finished_;  // the owner: a job finished
    std::deque<std::pair<uint64_t, Job>> queued_;
    std::vector<Completion> completed_;
    int outstanding_ = 0;
    bool stop_ = false;
    WorkerThreads workers_{mutex_, wake_, stop_};  // last: started once everything above exists
};

}  // namespace mnn_h2o
