// One file: one ctest program for KvCache::snapshot / restore (docs/session_format.md "KVCS").
// A restored cache continues bit-exactly like the one saved (q8 and f16, eviction on and off,
// policies with state, an observation window and query statistics); a snapshot of the restored
// cache equals the saved one; a mismatching cache is refused naming the field; a truncated
// snapshot is refused at every length and leaves the cache as it was; flipped bytes either are
// refused or restore a cache that keeps working (run under ASan/UBSan by scripts/test_sanitizers.sh).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/cache/snapshot_io.h"
#include "mnn_h2o/eviction/eviction_config.h"

#include "test_support.h"

using namespace mnn_h2o;

static KvCacheConfig small_config(KvDtype dtype) {
    KvCacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.n_heads = 4;
    c.dtype = dtype;
    c.block_tokens = 16;
    c.max_tokens = 512;
    c.threads = 1;
    return c;
}

// Evicts early and often: a 1/2 budget once 64 tokens were seen, an update every 8 decode tokens.
static EvictionConfig evicting(const std::string& policy) {
    EvictionConfig c;
    c.policy = policy;
    c.target_keep_ratio = 0.5;
    c.target_lossy_ratio = 0.0;
    c.sink_tokens = 16;
    c.recent_tokens = 16;
    c.trigger_min_tokens = 64;
    c.update_interval = 8;
    c.observation_window = 8;
    return c;
}

static std::unique_ptr<KvCache> make_cache(KvDtype dtype, const std::string& policy) {
    auto cache = std::make_unique<KvCache>(small_config(dtype));
    if (!policy.empty()) cache->enable_eviction(evicting(policy));
    return cache;
}

// n tokens through every layer (random q/k/v from rng); the attention outputs appended to *outs.
static void step_layers(KvCache& cache, int n, std::mt19937& rng, std::vector<float>* outs) {
    const KvCacheConfig& c = cache.config();
    for (int layer = 0; layer < c.n_layers; ++layer) {
        const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * c.n_heads * c.head_dim, 2.f);
        const std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * c.n_kv_heads * c.head_dim);
        const std::vector<float> v = random_vec(rng, k.size());
        std::vector<float> o(q.size());
        cache.step(layer, q.data(), k.data(), v.data(), n, o.data());
        if (outs) outs->insert(outs->end(), o.begin(), o.end());
    }
}

// One forward of n tokens, then end_step.
static void forward(KvCache& cache, int n, bool prefill, std::mt19937& rng, std::vector<float>* outs) {
    step_layers(cache, n, rng, outs);
    cache.end_step(n, prefill);
}

static int64_t evictions(const KvCache& cache) {
    int64_t n = 0;
    for (const auto& l : cache.eviction_stats().layers) n += l.counters.evictions;
    return n;
}

// A context reconstruction pass of n tokens (what the engine runs for kvzip after a prompt): their
// K/V are dropped again, the peaks they gave the held blocks become reconstruction scores.
static void reconstruct(KvCache& cache, int n, std::mt19937& rng) {
    cache.begin_reconstruction();
    step_layers(cache, n, rng, nullptr);
    cache.rewind_reconstruction();
    cache.end_reconstruction();
}

// A cache that has prefilled and decoded past several evictions (kvzip: ranked by the scores of a
// reconstruction pass after the prompt).
static void fill(KvCache& cache, std::mt19937& rng, bool reconstructs = false) {
    forward(cache, 100, true, rng, nullptr);
    if (reconstructs) reconstruct(cache, 60, rng);
    for (int t = 0; t < 29; ++t) forward(cache, 1, false, rng, nullptr);
}

// The snapshot with the per-layer timings (policy_us, compact_us: measured, not state) zeroed.
static std::vector<uint8_t> state_of(const KvCache& cache) {
    std::vector<uint8_t> s = cache.snapshot();
    const size_t kHeader = 40 + 4 * static_cast<size_t>(cache.config().n_layers);  // and LayerWindows
    constexpr size_t kCounters = 80, kTimings = 32;
    for (int layer = 0; layer < cache.config().n_layers; ++layer)
        std::memset(s.data() + kHeader + layer * kCounters + kTimings, 0, 16);
    return s;
}

static bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

static void test_round_trip(KvDtype dtype, const std::string& policy) {
    const char* dt = kv_dtype_name(dtype);
    std::mt19937 rng(7);
    auto saved = make_cache(dtype, policy);
    fill(*saved, rng, policy == "kvzip");
    if (!policy.empty()) CHECK(evictions(*saved) > 0, "%s %s: the filled cache evicted nothing", dt, policy.c_str());
    const std::vector<uint8_t> bytes = saved->snapshot();

    auto loaded = make_cache(dtype, policy);
    std::mt19937 other(99);
    forward(*loaded, 20, true, other, nullptr);  // restore replaces whatever the cache held
    loaded->restore(bytes.data(), bytes.size());
    CHECK(loaded->snapshot() == bytes, "%s %s: the restored cache's snapshot differs", dt, policy.c_str());
    CHECK(loaded->bytes_held() == saved->bytes_held(), "%s %s: bytes held %zu vs %zu", dt, policy.c_str(),
          loaded->bytes_held(), saved->bytes_held());

    // Both continue with the same inputs through further prefill, decode and evictions.
    std::mt19937 rng_a(3), rng_b(3);
    std::vector<float> out_a, out_b;
    forward(*saved, 40, true, rng_a, &out_a);
    forward(*loaded, 40, true, rng_b, &out_b);
    for (int t = 0; t < 40; ++t) {
        forward(*saved, 1, false, rng_a, &out_a);
        forward(*loaded, 1, false, rng_b, &out_b);
    }
    CHECK(bit_equal(out_a, out_b), "%s %s: outputs after the restore differ", dt, policy.c_str());
    const std::vector<uint8_t> a = state_of(*saved), b = state_of(*loaded);
    size_t first = 0;
    while (first < a.size() && first < b.size() && a[first] == b[first]) ++first;
    CHECK(a == b, "%s %s: the states diverged at byte %zu of %zu", dt, policy.c_str(), first, a.size());
}

static void test_mismatch_refused() {
    std::mt19937 rng(1);
    auto q8 = make_cache(KvDtype::Q8, "h2o");
    fill(*q8, rng);
    const std::vector<uint8_t> bytes = q8->snapshot();
    const auto refused = [&](KvCache& cache, const char* needle) {
        try {
            cache.restore(bytes.data(), bytes.size());
        } catch (const SnapshotError& e) {
            CHECK(std::string(e.what()).find(needle) != std::string::npos, "'%s' does not name %s", e.what(), needle);
            return;
        }
        CHECK(false, "a cache differing in %s restored the snapshot", needle);
    };
    auto f16 = make_cache(KvDtype::F16, "h2o");
    refused(*f16, "dtype");
    auto off = make_cache(KvDtype::Q8, "");
    refused(*off, "this cache has it off");
    auto other_policy = make_cache(KvDtype::Q8, "snapkv");
    refused(*other_policy, "eviction config");
    KvCacheConfig c = small_config(KvDtype::Q8);
    c.max_tokens = 1024;
    KvCache longer(c);
    longer.enable_eviction(evicting("h2o"));
    refused(longer, "max_tokens");

    StoreConfig store;
    store.mode = StoreMode::Full;
    auto f16_store = make_cache(KvDtype::F16, "h2o");
    f16_store->enable_store(store);
    CHECK(throws<std::invalid_argument>([&] { f16_store->snapshot(); }), "snapshot with the store on");
    CHECK(throws<SnapshotError>([&] { f16_store->restore(bytes.data(), bytes.size()); }), "restore with the store on");
}

// Truncated at every length: refused, and the cache holds what it held.
static void test_truncation_refused() {
    std::mt19937 rng(2);
    auto src = make_cache(KvDtype::Q8, "snapkv");
    fill(*src, rng);
    const std::vector<uint8_t> bytes = src->snapshot();
    auto cache = make_cache(KvDtype::Q8, "snapkv");
    forward(*cache, 30, true, rng, nullptr);
    const std::vector<uint8_t> before = cache->snapshot();
    int accepted = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
        try {
            cache->restore(bytes.data(), n);
            ++accepted;
        } catch (const SnapshotError&) {
        }
    }
    CHECK(accepted == 0, "%d truncated snapshots were accepted", accepted);
    CHECK(cache->snapshot() == before, "a refused restore changed the cache");
    std::vector<uint8_t> longer = bytes;
    longer.push_back(0);
    CHECK(throws<SnapshotError>([&] { cache->restore(longer.data(), longer.size()); }), "a trailing byte was accepted");
}

// Any byte flipped: refused, or restored into a cache that still steps, evicts and snapshots.
// The container's CRC refuses these in a saved file; here the decoder must stay in bounds alone.
static void test_flipped_bytes() {
    for (const char* policy : {"h2o", "snapkv", "random"}) {
        std::mt19937 rng(5);
        auto src = make_cache(KvDtype::Q8, policy);
        fill(*src, rng);
        const std::vector<uint8_t> bytes = src->snapshot();
        auto cache = make_cache(KvDtype::Q8, policy);
        const size_t step = bytes.size() / 1500 + 1;  // about 1500 offsets per policy
        int refused = 0, restored = 0;
        for (size_t i = 0; i < bytes.size(); i += step) {
            std::vector<uint8_t> bad = bytes;
            bad[i] ^= static_cast<uint8_t>(1u << (i % 8));
            try {
                cache->restore(bad.data(), bad.size());
            } catch (const SnapshotError&) {
                ++refused;
                continue;
            }
            ++restored;
            if (restored % 50 == 0) {  // a few of them also keep running
                std::mt19937 r(11);
                try {
                    for (int t = 0; t < 9; ++t) forward(*cache, 1, false, r, nullptr);
                } catch (const std::exception&) {
                }
                cache->snapshot();
            }
        }
        CHECK(refused > 0 && restored > 0, "%s: flips refused %d, restored %d", policy, refused, restored);
    }
}

// A cache with a sliding-window layer (Gemma 3's local layers) round-trips, windows and all, with
// eviction (kvzip, its pass included) on its global layer; a cache with other windows refuses it;
// a version-1 snapshot (before windows) still restores into a cache without them.
static void test_windows() {
    KvCacheConfig c = small_config(KvDtype::Q8);
    c.windows = {24, 0};
    std::mt19937 rng(5);
    KvCache saved(c);
    saved.enable_eviction(evicting("kvzip"));
    fill(saved, rng, true);
    CHECK(evictions(saved) > 0 && saved.length(0, 0) < 24 + 16, "windowed cache: %lld plans, window layer %d",
          static_cast<long long>(evictions(saved)), saved.length(0, 0));
    const std::vector<uint8_t> bytes = saved.snapshot();
    KvCache loaded(c);
    loaded.enable_eviction(evicting("kvzip"));
    loaded.restore(bytes.data(), bytes.size());
    CHECK(loaded.snapshot() == bytes, "windowed: the restored cache's snapshot differs");
    std::mt19937 rng_a(4), rng_b(4);
    std::vector<float> out_a, out_b;
    for (int t = 0; t < 30; ++t) {
        forward(saved, 1, false, rng_a, &out_a);
        forward(loaded, 1, false, rng_b, &out_b);
    }
    CHECK(bit_equal(out_a, out_b), "windowed: outputs after the restore differ");

    KvCacheConfig other = c;
    other.windows = {32, 0};
    KvCache wider(other);
    wider.enable_eviction(evicting("kvzip"));
    bool named = false;
    try {
        wider.restore(bytes.data(), bytes.size());
    } catch (const SnapshotError& e) {
        named = std::string(e.what()).find("layer 0 has a sliding window of 24 tokens, this cache's 32") != std::string::npos;
    }
    CHECK(named, "a cache with another window restored the snapshot, or did not say why");

    // Version 1: no LayerWindows after the header.
    auto plain = make_cache(KvDtype::Q8, "h2o");
    std::mt19937 rng_c(6);
    fill(*plain, rng_c);
    std::vector<uint8_t> v2 = plain->snapshot(), v1 = v2;
    v1.erase(v1.begin() + 40, v1.begin() + 40 + 4 * 2);
    const uint32_t one = 1;
    std::memcpy(v1.data() + 4, &one, 4);
    auto restored = make_cache(KvDtype::Q8, "h2o");
    restored->restore(v1.data(), v1.size());
    CHECK(restored->snapshot() == v2, "a version-1 snapshot restores as the same cache");
    KvCache windowed(c);
    windowed.enable_eviction(evicting("h2o"));
    CHECK(throws<SnapshotError>([&] { windowed.restore(v1.data(), v1.size()); }),
          "a version-1 snapshot (every layer global) into a cache with a window");
}

int main() {
    test_windows();
    for (KvDtype dtype : {KvDtype::Q8, KvDtype::F16, KvDtype::Q4R})
        for (const char* policy : {"", "h2o", "snapkv", "expected_attention", "random", "kvzip"})
            test_round_trip(dtype, policy);
    test_mismatch_refused();
    test_truncation_refused();
    test_flipped_bytes();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all kv snapshot tests passed\n");
    return 0;
}
