// SpinTeam: every task of every run runs exactly once, whatever the thread count and task count,
// including runs after the workers went to sleep or were told to rest; a team of one runs inline; shutdown joins.
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

int main() {
    for (int threads : {1, 2, 3}) every_task_once(threads);
    sums_match();
    CHECK(throws<std::invalid_argument>([] { SpinTeam t(0); }), "0 threads");
    std::printf("test_spin_team: %s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
