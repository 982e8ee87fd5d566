// Shared scaffolding of the native test programs: a CHECK that counts failures and goes on,
// exception and memory helpers. Each test's main() returns g_failures != 0.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

static int g_failures = 0;
#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            ++g_failures;                                               \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                   \
            std::printf("\n");                                          \
        }                                                               \
    } while (0)

// True if f() throws an E (and nothing else).
template <class E, class F>
[[maybe_unused]] static bool throws(F&& f) {
    try {
        f();
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
    return false;
}

// Resident set size of this process, from /proc (Linux, Android).
[[maybe_unused]] static long rss_bytes() {
    std::ifstream statm("/proc/self/statm");
    long size = 0, resident = 0;
    statm >> size >> resident;
    return resident * sysconf(_SC_PAGESIZE);
}

[[maybe_unused]] static std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale = 1.f) {
    std::normal_distribution<float> dist(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}
