#include "mnn_h2o/runtime/work_queue.h"

#include <exception>
#include <stdexcept>

namespace mnn_h2o {

WorkQueue::WorkQueue(int n_threads, int capacity) : capacity_(capacity) {
    if (n_threads < 1) throw std::invalid_argument("WorkQueue: n_threads must be >= 1");
    if (capacity < 1) throw std::invalid_argument("WorkQueue: capacity must be >= 1");
    workers_.start(0, n_threads, [this](int t) { worker_loop(t); });
}

WorkQueue::~WorkQueue() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        queued_.clear();
    }
    workers_.stop();
}

bool WorkQueue::try_submit(uint64_t id, Job job) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (outstanding_ >= capacity_) return false;
        queued_.emplace_back(id, std::move(job));
        ++outstanding_;
    }
    wake_.notify_one();
    return true;
}

std::vector<WorkQueue::Completion> WorkQueue::collect() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Completion> done;
    done.swap(completed_);
    outstanding_ -= static_cast<int>(done.size());
    return done;
}

std::vector<WorkQueue::Completion> WorkQueue::wait_collect() {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return !completed_.empty() || outstanding_ == 0; });
    std::vector<Completion> done;
    done.swap(completed_);
    outstanding_ -= static_cast<int>(done.size());
    return done;
}

int WorkQueue::outstanding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return outstanding_;
}

void WorkQueue::worker_loop(int worker) {
    for (;;) {
        std::pair<uint64_t, Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [this] { return stop_ || !queued_.empty(); });
            if (stop_) return;
            job = std::move(queued_.front());
            queued_.pop_front();
        }
        Completion c;
        c.id = job.first;
        try {
            job.second(worker);
        } catch (const std::exception& e) {
            c.failed = true;
            c.error = e.what();
        } catch (...) {
            c.failed = true;
            c.error = "unknown exception";
        }
        job.second = nullptr;  // the job's captures go before the owner hears it finished
        {
            std::lock_guard<std::mutex> lock(mutex_);
            completed_.push_back(std::move(c));
        }
        finished_.notify_all();
    }
}

}  // namespace mnn_h2o
