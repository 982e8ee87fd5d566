// Shared scaffolding of the native test programs: a CHECK that counts failures and goes on,
// exception and memory helpers. Each test's main() returns g_failures != 0.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/kv_dtype.h"
#include "mnn_h2o/runtime/cpu_features.h"

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

// A KvCacheConfig from the shape and settings in one call (its config-key fields follow the
// schema's order, so a braced list would not say which is which); the rest are its defaults.
[[maybe_unused]] static mnn_h2o::KvCacheConfig kv_config(int n_layers, int n_kv_heads, int head_dim, int n_heads,
                                                         mnn_h2o::KvDtype dtype = mnn_h2o::KvCacheConfig{}.dtype,
                                                         int block_tokens = mnn_h2o::KvCacheConfig{}.block_tokens,
                                                         int max_tokens = mnn_h2o::KvCacheConfig{}.max_tokens,
                                                         int threads = mnn_h2o::KvCacheConfig{}.threads) {
    mnn_h2o::KvCacheConfig c;
    c.n_layers = n_layers;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.n_heads = n_heads;
    c.dtype = dtype;
    c.block_tokens = block_tokens;
    c.max_tokens = max_tokens;
    c.threads = threads;
    return c;
}

// The n_q queries as attention over a cache of this dtype sees them (attention_queries), in the
// keys' unrotated space as float64 references read them: a q8r cache's are rounded in its rotated
// basis and rotated back here.
// The relative error an ISA's attention output may have against a float64 reference: the float
// kernels' 2e-5, except a q8 cache's prompt (n_q > 1) on the AVX-512 BF16 set, whose P x V rounds
// each probability (times its value scale) to bf16: 8 significant bits, up to 2^-8 of each
// product, about 2.5e-3 of a random case's output; a bound twice the largest measured.
[[maybe_unused]] static double attention_tolerance(mnn_h2o::Isa isa, mnn_h2o::KvDtype dtype, int n_q) {
    const bool q8_rows = dtype == mnn_h2o::KvDtype::Q8 || dtype == mnn_h2o::KvDtype::Q8R;
    if (isa == mnn_h2o::Isa::Avx512 && mnn_h2o::cpu_features().avx512_bf16 && q8_rows && n_q > 1) return 6e-3;
    return 2e-5;
}

[[maybe_unused]] static std::vector<float> queries_seen(mnn_h2o::KvDtype dtype, const std::vector<float>& q, int n_q,
                                                        int hd) {
    const size_t rows = q.size() / hd;
    const bool rotated = mnn_h2o::kv_dtype_rotated(dtype);
    std::vector<float> x = q, rounded;
    std::vector<uint8_t> codes;
    if (rotated) mnn_h2o::hadamard_rows(x.data(), rows, hd);
    const float* seen = mnn_h2o::attention_queries(dtype, x.data(), n_q, static_cast<int>(rows / n_q), hd, codes, rounded);
    x.assign(seen, seen + rows * hd);
    if (rotated) mnn_h2o::hadamard_rows(x.data(), rows, hd);
    return x;
}
