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

SpinTeam::SpinTeam(int n_threads) {
    if (n_threads < 1) throw std::invalid_argument("SpinTeam: n_threads must be >= 1");
    try {
        for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
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

void SpinTeam::take_tasks() {
    for (;;) {
        const int task = next_.fetch_add(1);
        if (task >= n_tasks_) return;
        fn_(ctx_, task);
        done_.fetch_add(1);
    }
}

void SpinTeam::run_job(int n_tasks, TaskFn fn, void* ctx) {
    if (n_tasks <= 0) return;
    if (workers_.empty() || n_tasks == 1) {
        for (int i = 0; i < n_tasks; ++i) fn(ctx, i);
        return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_tasks_ = n_tasks;
    next_.store(0);
    done_.store(0);
    open_.store(true);
    resting_.store(false);
    generation_.fetch_add(1);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (sleeping_ > 0) wake_.notify_all();
    }
    take_tasks();
    while (done_.load() < n_tasks) MNN_H2O_PAUSE();
    open_.store(false);
    while (in_job_.load() != 0) MNN_H2O_PAUSE();
}

void SpinTeam::worker_loop() {
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
        if (open_.load()) take_tasks();
        in_job_.fetch_sub(1);
    }
}

}  // namespace mnn_h2o
