#include "mnn_h2o/runtime/spin_team.h"

#include <chrono>
#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MNN_H2O_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MNN_H2O_PAUSE() __asm__ __volatile__("yield")
#else
#define MNN_H2O_PAUSE() ((void)0)
#endif

namespace mnn_h2o {

namespace {

// The team whose task this thread is running (and its thread index there), so that a nested
// parallel_for on the same team runs inline instead of waiting for itself.
thread_local const SpinTeam* t_running_team = nullptr;
thread_local int t_thread_index = 0;

}  // namespace

SpinTeam::SpinTeam(int n_threads) {
    if (n_threads < 1) throw std::invalid_argument("SpinTeam: n_threads must be >= 1");
    try {
        for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (...) {
        stop();
        throw;
    }
}

SpinTeam::~SpinTeam() { stop(); }

void SpinTeam::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        stop_flag_.store(true);
    }
    wake_.notify_all();
    for (std::thread& t : workers_)
        if (t.joinable()) t.join();
    workers_.clear();
}

void SpinTeam::take_tasks(int thread) {
    const SpinTeam* outer_team = t_running_team;
    const int outer_index = t_thread_index;
    t_running_team = this;
    t_thread_index = thread;
    for (;;) {
        const int task = next_.fetch_add(1);
        if (task >= n_tasks_) break;
        if (!failed_.load(std::memory_order_relaxed)) {
            try {
                fn_(ctx_, task, thread);
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex_);
                if (!error_) error_ = std::current_exception();
                failed_.store(true);
            }
        }
        done_.fetch_add(1);
    }
    t_running_team = outer_team;
    t_thread_index = outer_index;
}

void SpinTeam::run_tasks(int n_tasks, TaskFn fn, void* ctx) {
    if (n_tasks <= 0) return;
    if (workers_.empty() || n_tasks == 1 || t_running_team == this) {
        const int thread = t_running_team == this ? t_thread_index : 0;
        for (int i = 0; i < n_tasks; ++i) fn(ctx, i, thread);
        return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_tasks_ = n_tasks;
    next_.store(0);
    done_.store(0);
    failed_.store(false);
    open_.store(true);
    resting_.store(false);
    generation_.fetch_add(1);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (sleeping_ > 0) wake_.notify_all();
    }
    take_tasks(0);
    while (done_.load() < n_tasks) MNN_H2O_PAUSE();
    open_.store(false);
    while (in_job_.load() != 0) MNN_H2O_PAUSE();
    if (failed_.load()) {
        std::exception_ptr error;
        {
            std::lock_guard<std::mutex> lock(error_mutex_);
            error = std::move(error_);
            error_ = nullptr;
        }
        std::rethrow_exception(error);
    }
}

void SpinTeam::worker_loop(int thread) {
    using clock = std::chrono::steady_clock;
    uint64_t seen = generation_.load();
    for (;;) {
        // Poll for a new job until told to rest or for kSpinMicros, then sleep until one is
        // published or we stop.
        const auto until = clock::now() + std::chrono::microseconds(kSpinMicros);
        int polls = 0;
        while (generation_.load() == seen && !stop_flag_.load()) {
            MNN_H2O_PAUSE();
            if (resting_.load() || (++polls % 64 == 0 && clock::now() > until)) {
                std::unique_lock<std::mutex> lock(mutex_);
                ++sleeping_;
                wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
                --sleeping_;
                break;
            }
        }
        if (stop_flag_.load()) return;
        seen = generation_.load();
        in_job_.fetch_add(1);
        if (open_.load()) take_tasks(thread);
        in_job_.fetch_sub(1);
    }
}

}  // namespace mnn_h2o
