// Scaffolding of the eviction tests (test_eviction_*.cpp): a small cache geometry, random steps,
// reading a head back and a keep-ratio config.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/eviction/eviction_config.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/cache/kv_cache.h"

#include "test_support.h"

using namespace mnn_h2o;

[[maybe_unused]] static KvCacheConfig small_config(int n_layers, int max_tokens, KvDtype dtype = KvDtype::F32, int block_tokens = 16) {
    KvCacheConfig c;
    c.n_layers = n_layers;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.n_heads = 6;
    c.dtype = dtype;
    c.block_tokens = block_tokens;
    c.max_tokens = max_tokens;
    c.threads = 1;
    return c;
}

// One step of n random tokens on layer.
[[maybe_unused]] static void step(KvCache& cache, int layer, int n, std::mt19937& rng, std::vector<float>* out = nullptr) {
    const KvCacheConfig& c = cache.config();
    const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * c.n_heads * c.head_dim, 2.f);
    const std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * c.n_kv_heads * c.head_dim);
    const std::vector<float> v = random_vec(rng, k.size());
    std::vector<float> o(q.size());
    cache.step(layer, q.data(), k.data(), v.data(), n, o.data());
    if (out) *out = o;
}

// One head's K rows (and V rows into v_out) as float32 [length][head_dim].
[[maybe_unused]] static std::vector<float> read_k(const KvCache& cache, int layer, int h, std::vector<float>* v_out = nullptr) {
    const int n = cache.length(layer, h), hd = cache.config().head_dim;
    std::vector<float> k(static_cast<size_t>(n) * hd), v(k.size());
    cache.read(layer, h, k.data(), v.data());
    if (v_out) *v_out = v;
    return k;
}

// The H2O machinery these tests check: policy h2o and the same budget in every layer. The
// shipped default (kvzip, one global budget) is test_reconstruction.cpp's.
[[maybe_unused]] static EvictionConfig eviction_config() {
    EvictionConfig c;
    c.policy = "h2o";
    c.layer_budget = "uniform";
    return c;
}

// No ratio target, small floors, from the first token on: the base of a test's own budget.
[[maybe_unused]] static EvictionConfig small_floors_config() {
    EvictionConfig c = eviction_config();
    c.target_lossy_ratio = 0.0;
    c.sink_tokens = 16;
    c.recent_tokens = 32;
    c.trigger_min_tokens = 0;
    return c;
}

// Eviction to a static keep ratio with small floors, from the first token on.
[[maybe_unused]] static EvictionConfig keep_config(double keep_ratio, int layer_start = 0) {
    EvictionConfig c = small_floors_config();
    c.target_keep_ratio = keep_ratio;
    c.layer_start = layer_start;
    return c;
}
