// A fixed pool of worker threads that sleep on a condition variable while idle.
//
// Why not OpenMP or a spinning pool: MNN runs the dense layers on the same cores right before and
// after every attention call, and a worker that spins while waiting for work steals MNN's core
// (it made MNN 4-7x slower here). Workers here block in the kernel between calls. Waking one
// costs a few microseconds, and tens when its vCPU had halted while MNN ran, so the caller never
// waits for a worker to wake: it runs the tasks itself, and a worker that arrives after the last
// task was taken does not join (decode attention at 4096 tokens: ~8% less time than waiting).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <type_traits>
#include <utility>

#include "mnn_h2o/runtime/team.h"
#include "mnn_h2o/runtime/worker_threads.h"

namespace mnn_h2o {

class ThreadPool final : public Team {
public:
    // n_threads counts the calling thread, which always takes part: 1 means no worker threads.
    explicit ThreadPool(int n_threads);
    ~ThreadPool() override;  // wakes and joins every worker
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const override { return workers_.size() + 1; }

    // Team::parallel_for: tasks are handed out in increasing order, one at a time, so uneven
    // tasks balance. Calls from different threads are serialised.

private:
    void run_tasks(int n_tasks, TaskFn fn, void* ctx) override;
    void worker_loop(int thread);
    void work(int thread);

    std::mutex call_mutex_;  // one parallel_for at a time

    // The current job, published under mutex_ together with a new generation number.
    std::mutex mutex_;
    std::condition_variable wake_;  // workers wait here for a new generation or shutdown
    std::condition_variable done_;  // the caller waits here for the workers to finish
    uint64_t generation_ = 0;
    bool stop_ = false;
    int busy_workers_ = 0;  // workers that joined the current job and have not left it
    bool closed_ = true;    // the caller ran out of tasks: late workers must not join
    TaskFn fn_ = nullptr;
    void* ctx_ = nullptr;
    int n_tasks_ = 0;
    std::atomic<int> next_task_{0};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;  // first task exception, written once under mutex_
    WorkerThreads workers_{mutex_, wake_, stop_};  // threads 1 .. size() - 1
};

}  // namespace mnn_h2o
