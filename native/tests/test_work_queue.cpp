// WorkQueue: every job runs once, the bound counts jobs until collected, exceptions become failed
// completions, and destruction with queued work neither hangs nor runs what was not started.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <thread>

#include "mnn_h2o/runtime/work_queue.h"

#include "test_support.h"

using namespace mnn_h2o;

static void test_runs_and_collects() {
    WorkQueue q(2, 8);
    std::atomic<int> sum{0};
    std::atomic<int> bad_worker{0};
    for (int i = 0; i < 8; ++i)
        CHECK(q.try_submit(static_cast<uint64_t>(i), [&, i](int worker) {
            if (worker < 0 || worker >= 2) ++bad_worker;
            sum += i;
        }), "submit %d refused below capacity", i);
    CHECK(!q.try_submit(99, [](int) {}), "a ninth job was taken with capacity 8");
    std::set<uint64_t> ids;
    while (q.outstanding() > 0)
        for (const auto& c : q.wait_collect()) {
            CHECK(!c.failed, "job %llu failed", static_cast<unsigned long long>(c.id));
            ids.insert(c.id);
        }
    CHECK(ids.size() == 8 && sum == 28 && bad_worker == 0, "%zu ids, sum %d", ids.size(), sum.load());
    CHECK(q.wait_collect().empty() && q.collect().empty(), "nothing outstanding");
    CHECK(q.try_submit(100, [](int) {}), "room again after collecting");
    while (q.outstanding() > 0) q.wait_collect();
}

static void test_exceptions_become_failures() {
    WorkQueue q(1, 4);
    q.try_submit(1, [](int) { throw std::runtime_error("boom"); });
    q.try_submit(2, [](int) {});
    int failed = 0, ok = 0;
    while (q.outstanding() > 0)
        for (const auto& c : q.wait_collect()) {
            if (c.failed) {
                ++failed;
                CHECK(c.id == 1 && c.error == "boom", "failure id %llu error '%s'", static_cast<unsigned long long>(c.id),
                      c.error.c_str());
            } else {
                ++ok;
            }
        }
    CHECK(failed == 1 && ok == 1, "failed %d ok %d", failed, ok);
}

static void test_destroy_with_queued_jobs() {
    std::atomic<int> started{0};
    std::atomic<bool> release{false};
    {
        std::thread unblock;
        struct Join {  // destroyed after the queue: joins the thread that lets job 0 finish
            std::thread& t;
            ~Join() { t.join(); }
        } join{unblock};
        WorkQueue q(1, 16);
        q.try_submit(0, [&](int) {
            ++started;
            while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        });
        for (int i = 1; i < 16; ++i) q.try_submit(static_cast<uint64_t>(i), [&](int) { ++started; });
        while (started == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        unblock = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            release = true;
        });
        // The destructor drops the 15 queued jobs at once, then waits for the running one.
    }
    CHECK(started == 1, "%d jobs ran; the queued ones should have been dropped", started.load());
    CHECK(throws<std::invalid_argument>([] { WorkQueue q(0, 1); }), "zero threads");
    CHECK(throws<std::invalid_argument>([] { WorkQueue q(1, 0); }), "zero capacity");
}

int main() {
    test_runs_and_collects();
    test_exceptions_become_failures();
    test_destroy_with_queued_jobs();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all work queue tests passed\n");
    return 0;
}
