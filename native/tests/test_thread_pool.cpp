// ThreadPool: every task runs once, thread indices are exclusive, exceptions propagate, nested
// and concurrent callers work, late workers stay out of finished jobs, and the pool shuts down
// cleanly (run it under TSan too).
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mnn_h2o/runtime/thread_pool.h"

#include "test_support.h"

using namespace mnn_h2o;

static void test_runs_every_task() {
    for (int n_threads : {1, 2, 4}) {
        ThreadPool pool(n_threads);
        CHECK(pool.size() == n_threads, "size");
        for (int round = 0; round < 200; ++round) {
            const int n = round % 17;
            std::vector<int> hits(n, 0);
            std::vector<std::atomic<int>> in_thread(n_threads);
            std::atomic<bool> overlap{false};
            pool.parallel_for(n, [&](int task, int thread) {
                if (in_thread[thread].fetch_add(1) != 0) overlap = true;
                ++hits[task];  // distinct tasks write distinct elements
                in_thread[thread].fetch_sub(1);
            });
            for (int i = 0; i < n; ++i) CHECK(hits[i] == 1, "task %d ran %d times", i, hits[i]);
            CHECK(!overlap, "two tasks shared a thread index");
        }
    }
}

static void test_exceptions() {
    ThreadPool pool(3);
    std::atomic<int> ran{0};
    bool caught = false;
    try {
        pool.parallel_for(50, [&](int task, int) {
            ++ran;
            if (task == 7) throw std::runtime_error("task 7");
        });
    } catch (const std::runtime_error& e) {
        caught = std::string(e.what()) == "task 7";
    }
    CHECK(caught, "exception not propagated");
    // The pool is still usable afterwards.
    std::atomic<int> sum{0};
    pool.parallel_for(100, [&](int task, int) { sum += task; });
    CHECK(sum == 4950, "sum %d", sum.load());
}

static void test_nested_and_concurrent() {
    ThreadPool pool(2);
    std::atomic<int> inner{0};
    pool.parallel_for(4, [&](int, int) { pool.parallel_for(5, [&](int, int) { ++inner; }); });
    CHECK(inner == 20, "nested ran %d", inner.load());

    std::atomic<long> total{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < 3; ++c)
        callers.emplace_back([&] {
            for (int i = 0; i < 100; ++i) pool.parallel_for(8, [&](int task, int) { total += task; });
        });
    for (auto& t : callers) t.join();
    CHECK(total == 3 * 100 * 28, "concurrent callers total %ld", total.load());
}

// Back-to-back small jobs: a worker that wakes after the caller finished a job must not join it
// (its lambda and counters are gone: ASan/TSan would see the stale access), and must still join
// the next one.
static void test_late_workers() {
    ThreadPool pool(2);
    long joined = 0;
    for (int round = 0; round < 20000; ++round) {
        std::vector<int> hits(2, 0);
        std::atomic<int> by_worker{0};
        pool.parallel_for(2, [&](int task, int thread) {
            ++hits[task];
            if (thread) ++by_worker;
        });
        CHECK(hits[0] == 1 && hits[1] == 1, "round %d: tasks ran %d and %d times", round, hits[0], hits[1]);
        joined += by_worker.load() > 0;
    }
    std::printf("  worker joined %ld of 20000 two-task jobs\n", joined);
}

static void test_shutdown() {
    for (int i = 0; i < 50; ++i) {
        ThreadPool pool(3);
        if (i % 2) pool.parallel_for(3, [](int, int) {});
    }
    bool threw = false;
    try {
        ThreadPool bad(0);
    } catch (const std::invalid_argument&) {
        threw = true;
    }
    CHECK(threw, "n_threads 0 accepted");
}

int main() {
    test_runs_every_task();
    test_exceptions();
    test_nested_and_concurrent();
    test_late_workers();
    test_shutdown();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all thread pool tests passed\n");
    return 0;
}
