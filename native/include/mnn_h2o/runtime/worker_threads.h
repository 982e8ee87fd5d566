// The worker threads of ThreadPool and WorkQueue: the start and the shutdown they share.
//
// The owner's workers sleep on its condition variable under its mutex and leave their loop once
// its stop flag is set, so stopping sets that flag under the mutex, wakes them all and joins
// them. Starting is all or nothing: if a thread cannot be created, the ones already running are
// stopped and joined before the error propagates, so no owner is left half-built.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace mnn_h2o {

class WorkerThreads {
public:
    WorkerThreads(std::mutex& mutex, std::condition_variable& wake, bool& stop)
        : mutex_(mutex), wake_(wake), stop_(stop) {}
    WorkerThreads(const WorkerThreads&) = delete;
    WorkerThreads& operator=(const WorkerThreads&) = delete;

    // Runs loop(i) on a thread of its own for each i in [first, end).
    template <class Loop>
    void start(int first, int end, Loop loop) {
        try {
            threads_.reserve(static_cast<size_t>(end - first));
            for (int i = first; i < end; ++i) threads_.emplace_back([loop, i] { loop(i); });
        } catch (...) {
            stop();
            throw;
        }
    }

    // The owner calls it before its state goes (its destructor's first step); once is enough.
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (std::thread& t : threads_)
            if (t.joinable()) t.join();
    }

    int size() const { return static_cast<int>(threads_.size()); }

private:
    std::mutex& mutex_;
    std::condition_variable& wake_;
    bool& stop_;
    std::vector<std::thread> threads_;
};

}  // namespace mnn_h2o
