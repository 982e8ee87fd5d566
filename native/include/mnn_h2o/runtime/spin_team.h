// Fork-join over a few threads for jobs of a few microseconds: the decode layers' matrix products.
//
// Why not ThreadPool: its workers sleep on a condition variable, and waking one costs a few to
// tens of microseconds, as long as one of the decode layers' products takes. A SpinTeam's workers
// keep polling for the next job after each one, so the four products of a layer call find them
// awake, until the caller says rest(): then they sleep, and another pool gets the core (a worker
// polling through a multi-threaded attention took the core its workers needed: the cache step at
// 2048 tokens +0.4 ms a token; resting after every layer where the attention runs on one thread
// cost ~1 ms a token at 512, the workers waking late). A worker also sleeps after kSpinMicros
// without a job. As in ThreadPool the caller never waits for a worker to
// arrive: it takes tasks itself, and waits only for tasks a worker has already taken. It is a
// Team, so the attention of a decode token can run on it too (model/decode_token.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "mnn_h2o/runtime/team.h"

namespace mnn_h2o {

class SpinTeam final : public Team {
public:
    // How long a worker polls for the next job before it sleeps, unless told to rest earlier.
    static constexpr int kSpinMicros = 200;

    // n_threads counts the calling thread: 1 means no workers.
    explicit SpinTeam(int n_threads);
    ~SpinTeam() override;  // wakes and joins the workers
    SpinTeam(const SpinTeam&) = delete;
    SpinTeam& operator=(const SpinTeam&) = delete;

    int size() const override { return static_cast<int>(workers_.size()) + 1; }
    // Until rest(): a worker that has slept since (kSpinMicros without a job) wakes late, as a
    // ThreadPool's does, and the first call after it pays that once.
    bool polling() const override { return !resting_.load(std::memory_order_relaxed); }

    // Team::parallel_for, on the caller and the workers that are awake. One caller at a time.
    // The workers go to sleep once their current task is done, until the next run.
    void rest() { resting_.store(true); }

    // parallel_for without the thread index.
    template <class Fn>
    void run(int n_tasks, Fn&& fn) {
        parallel_for(n_tasks, [&fn](int task, int) { fn(task); });
    }

private:
    void run_tasks(int n_tasks, TaskFn fn, void* ctx) override;
    void stop();  // wakes and joins the workers
    void take_tasks(int thread);
    void worker_loop(int thread);

    // The current job. Its fields are written before open_ is set (both seq_cst), and a worker
    // reads them only between raising in_job_ and seeing open_: the caller clears open_ and then
    // waits for in_job_ to drop to 0 before it returns, so no worker touches a finished job.
    TaskFn fn_ = nullptr;
    void* ctx_ = nullptr;
    int n_tasks_ = 0;
    std::atomic<int> next_{0};
    std::atomic<int> done_{0};
    std::atomic<bool> open_{false};
    std::atomic<int> in_job_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> resting_{true};
    // A task's exception: the first one is kept (under error_mutex_) and rethrown by the caller;
    // the tasks after it are counted done without running.
    std::atomic<bool> failed_{false};
    std::mutex error_mutex_;
    std::exception_ptr error_;

    std::mutex mutex_;
    std::condition_variable wake_;
    int sleeping_ = 0;  // under mutex_
    bool stop_ = false;  // under mutex_; stop_flag_ mirrors it for the polling loop
    std::atomic<bool> stop_flag_{false};
    std::vector<std::thread> workers_;
};

}  // namespace mnn_h2o
