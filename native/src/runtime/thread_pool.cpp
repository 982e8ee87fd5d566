#include "mnn_h2o/runtime/thread_pool.h"

#include <stdexcept>

namespace mnn_h2o {

namespace {

// The pool whose task this thread is running (and its thread index there), so that a nested
// parallel_for on the same pool runs inline instead of deadlocking on call_mutex_.
thread_local const ThreadPool* t_running_pool = nullptr;
thread_local int t_thread_index = 0;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads < 1) throw std::invalid_argument("ThreadPool: n_threads must be >= 1");
    // Thread 0 is the caller's.
    workers_.start(1, n_threads, [this](int t) { worker_loop(t); });
}

ThreadPool::~ThreadPool() { workers_.stop(); }

void ThreadPool::run_tasks(int n_tasks, TaskFn fn, void* ctx) {
    if (n_tasks <= 0) return;
    if (workers_.size() == 0 || n_tasks == 1 || t_running_pool == this) {
        const int thread = t_running_pool == this ? t_thread_index : 0;
        for (int i = 0; i < n_tasks; ++i) fn(ctx, i, thread);
        return;
    }
    std::lock_guard<std::mutex> call(call_mutex_);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fn_ = fn;
        ctx_ = ctx;
        n_tasks_ = n_tasks;
        next_task_.store(0, std::memory_order_relaxed);
        failed_.store(false, std::memory_order_relaxed);
        error_ = nullptr;
        busy_workers_ = 0;
        closed_ = false;
        ++generation_;
    }
    wake_.notify_all();
    work(0);
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        // Wait only for workers that joined: one still waking up (tens of microseconds on a VM
        // whose idle vCPU halted) finds the job closed and goes back to sleep.
        closed_ = true;
        done_.wait(lock, [this] { return busy_workers_ == 0; });
        error = std::move(error_);
        error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
}

void ThreadPool::work(int thread) {
    const ThreadPool* outer_pool = t_running_pool;
    const int outer_index = t_thread_index;
    t_running_pool = this;
    t_thread_index = thread;
    for (;;) {
        const int task = next_task_.fetch_add(1, std::memory_order_relaxed);
        if (task >= n_tasks_ || failed_.load(std::memory_order_relaxed)) break;
        try {
            fn_(ctx_, task, thread);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
    t_running_pool = outer_pool;
    t_thread_index = outer_index;
}

void ThreadPool::worker_loop(int thread) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (closed_) continue;  // the caller already finished this job
            ++busy_workers_;
        }
        work(thread);
        std::lock_guard<std::mutex> lock(mutex_);
        if (--busy_workers_ == 0 && closed_) done_.notify_one();
    }
}

}  // namespace mnn_h2o
