// SpinTeam: every task of every run runs exactly once, whatever the thread count and task count,
// including runs after the workers went to sleep or were told to rest; a team of one runs inline; shutdown joins.
// As a Team: thread indices in range and never two tasks at once on one, a task's exception
// rethrown to the caller (the team usable after it), a nested call run inline.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mnn_h2o/runtime/spin_team.h"

#include "test_support.h"

using namespace mnn_h2o;

static void every_task_once(int threads) {
    SpinTeam team(threads);
    CHECK(team.size() == threads, "size %d, want %d", team.size(), threads);
    std::vector<std::atomic<int>> hits(64);
    std::atomic<int> other_threads{0};
    const auto caller = std::this_thread::get_id();
    for (int run = 0; run < 3000; ++run) {
        const int n = 1 + run % 17;
        for (int i = 0; i < n; ++i) hits[i].store(0);
        team.run(n, [&](int task) {
            hits[task].fetch_add(1);
            if (std::this_thread::get_id() != caller) other_threads.fetch_add(1);
        });
        for (int i = 0; i < n; ++i) CHECK(hits[i].load() == 1, "%d threads, run %d: task %d ran %d times", threads, run, i, hits[i].load());
        if (run % 500 == 499)  // past the polling window: the workers sleep, the next run wakes them
            std::this_thread::sleep_for(std::chrono::microseconds(3 * SpinTeam::kSpinMicros));
        if (run % 7 == 3) team.rest();  // the workers sleep at once; the next run wakes them
    }
    if (threads == 1) CHECK(other_threads.load() == 0, "a team of one ran tasks on another thread");
}

static void sums_match() {
    SpinTeam team(2);
    std::vector<long> out(1000);
    for (int run = 0; run < 200; ++run) {
        team.run(4, [&](int task) {
            for (int i = task * 250; i < (task + 1) * 250; ++i) out[i] = static_cast<long>(i) * run;
        });
        long sum = 0;
        for (long v : out) sum += v;
        CHECK(sum == 499500L * run, "run %d: sum %ld", run, sum);
    }
}

static void as_a_team(int threads) {
    SpinTeam spin(threads);
    Team& team = spin;
    std::vector<std::atomic<int>> busy(threads);
    std::atomic<int> bad{0}, ran{0};
    for (int run = 0; run < 500; ++run)
        team.parallel_for(1 + run % 9, [&](int, int thread) {
            if (thread < 0 || thread >= threads || busy[thread].fetch_add(1) != 0) bad.fetch_add(1);
            ran.fetch_add(1);
            if (thread >= 0 && thread < threads) busy[thread].fetch_sub(1);
        });
    CHECK(bad.load() == 0, "%d threads: %d tasks with a bad or shared thread index", threads, bad.load());
    for (int run = 0; run < 50; ++run) {
        std::atomic<int> after{0};
        const bool threw = throws<std::runtime_error>([&] {
            team.parallel_for(8, [&](int task, int) {
                if (task == 3) throw std::runtime_error("task 3");
                after.fetch_add(1);
            });
        });
        CHECK(threw, "%d threads, run %d: the task's exception was not rethrown", threads, run);
    }
    std::atomic<int> inner{0};
    team.parallel_for(4, [&](int, int thread) {
        team.parallel_for(3, [&](int, int inner_thread) {
            if (inner_thread == thread) inner.fetch_add(1);
        });
    });
    CHECK(inner.load() == 12, "%d threads: nested tasks %d of 12 inline on their thread", threads, inner.load());
    std::vector<std::atomic<int>> hits(16);
    team.parallel_for(16, [&](int task, int) { hits[task].fetch_add(1); });
    for (auto& h : hits) CHECK(h.load() == 1, "%d threads: a task after an error ran %d times", threads, h.load());
}

int main() {
    for (int threads : {1, 2, 3}) every_task_once(threads);
    for (int threads : {1, 2, 3}) as_a_team(threads);
    sums_match();
    CHECK(throws<std::invalid_argument>([] { SpinTeam t(0); }), "0 threads");
    std::printf("test_spin_team: %s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
