// When H2O runs: the decode-token schedule, eviction off leaving outputs unchanged, and the
// policy time counters.
#include "eviction_test_support.h"

// end_step counts decode tokens, the same for every layer: an update every update_interval
// tokens evicts on every evicting layer; after prefill only when the prompt exceeds the budget.
static void test_schedule() {
    KvCache cache(small_config(4, 2048, KvDtype::F16));
    EvictionConfig c = keep_config(0.5, 1);
    c.update_interval = 8;
    c.trigger_min_tokens = 64;
    cache.enable_eviction(c);
    std::mt19937 rng(6);
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 40, rng);
    CHECK(!cache.end_step(40, true) && cache.eviction_stats().updates == 0, "short prompt: below trigger, no update");
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 360, rng);
    const std::vector<float> prompt_k = read_k(cache, 2, 1);
    CHECK(cache.end_step(360, true), "prompt over budget: evicted after prefill");
    // The floors survive: the first 16 tokens (sink) and the last 32 (recent), row for row.
    const std::vector<float> kept_k = read_k(cache, 2, 1);
    CHECK(std::equal(prompt_k.begin(), prompt_k.begin() + 16 * 32, kept_k.begin()), "sink rows kept");
    CHECK(std::equal(prompt_k.end() - 32 * 32, prompt_k.end(), kept_k.end() - 32 * 32), "recent rows kept");
    EvictionStats st = cache.eviction_stats();
    CHECK(st.updates == 1, "one update after prefill");
    // 400 tokens, keep 0.5 -> 200 tokens -> 13 blocks (the blocks 200 tokens need)
    for (int layer = 1; layer < 4; ++layer)
        for (int h = 0; h < 2; ++h) {
            const int blocks = (cache.length(layer, h) + 15) / 16;
            CHECK(blocks == 13, "layer %d head %d holds %d blocks", layer, h, blocks);
        }
    CHECK(cache.length(0, 0) == 400, "layer 0 is outside the range");
    int evicting_calls = 0;
    for (int t = 1; t <= 64; ++t) {
        for (int layer = 0; layer < 4; ++layer) step(cache, layer, 1, rng);
        const bool evicted = cache.end_step(1, false);
        evicting_calls += evicted;
        CHECK(!evicted || t % 8 == 0, "evicted at decode token %d, not a multiple of 8", t);
        if (t % 8 == 0) {
            const int budget = (400 + t) / 2 / 16 + ((400 + t) / 2 % 16 != 0);
            for (int layer = 1; layer < 4; ++layer)
                CHECK((cache.length(layer, 0) + 15) / 16 <= budget, "over budget after the update at token %d", t);
        }
        CHECK(cache.eviction_stats().updates == 1 + t / 8, "updates after %d tokens: %lld", t,
              static_cast<long long>(cache.eviction_stats().updates));
    }
    // Held grows by 8 tokens and the budget by 4 per update: a block goes about every 32 tokens.
    CHECK(evicting_calls == 2, "evicting updates: %d", evicting_calls);
    st = cache.eviction_stats();
    for (int layer = 1; layer < 4; ++layer) {
        CHECK(st.layers[layer].counters.evictions == st.layers[1].counters.evictions, "every evicting layer evicts alike");
        CHECK(st.layers[layer].counters.tokens_seen == 464, "tokens_seen %lld",
              static_cast<long long>(st.layers[layer].counters.tokens_seen));
    }
    CHECK(st.layers[0].counters.evictions == 0 && st.layers[0].counters.policy_us == 0.0, "layer 0 costs nothing");
    CHECK(throws<std::invalid_argument>([&] { cache.end_step(0, false); }), "n_tokens >= 1");

    // Whole-model accounting: logical uncompressed bytes over bytes the pool hands out.
    const size_t token_bytes = 2 * 2 * 32 * 2;  // K and V, 2 heads, f16
    CHECK(st.bytes_uncompressed == 4 * 464 * token_bytes, "uncompressed %zu", st.bytes_uncompressed);
    CHECK(st.bytes_held == cache.bytes_held(), "held matches the pool");
    size_t sum = 0;
    for (const auto& l : st.layers) sum += l.bytes_held;
    CHECK(sum == st.bytes_held, "per-layer bytes add up");
    CHECK(std::fabs(st.lossy_ratio - static_cast<double>(st.bytes_uncompressed) / st.bytes_held) < 1e-12, "lossy ratio");
    CHECK(st.lossy_ratio > 1.4, "lossy ratio %.3f", st.lossy_ratio);

    cache.reset();
    st = cache.eviction_stats();
    CHECK(st.bytes_held == 0 && st.updates == 0 && st.layers[1].counters.evictions == 0 && st.lossy_ratio == 1.0,
          "reset clears the counters");
    CHECK(cache.eviction_config() != nullptr, "reset keeps H2O on");
}

// Eviction off, or a layer outside the range: outputs bit-identical to a cache that never had it.
static void test_off_is_unchanged() {
    const KvCacheConfig cc = small_config(3, 1024, KvDtype::F16);
    KvCache never(cc), toggled(cc), other_layers(cc);
    toggled.enable_eviction(keep_config(0.25, 0));
    toggled.disable_eviction();
    EvictionConfig c = keep_config(0.25, 1);
    c.layer_end = 2;
    other_layers.enable_eviction(c);
    std::mt19937 r1(8), r2(8), r3(8);
    for (int n : {100, 1, 1, 7, 1}) {
        for (int layer = 0; layer < 3; layer += 2) {
            std::vector<float> o1, o2, o3;
            step(never, layer, n, r1, &o1);
            step(toggled, layer, n, r2, &o2);
            step(other_layers, layer, n, r3, &o3);
            CHECK(o1 == o2 && o1 == o3, "layer %d, %d tokens: outputs differ", layer, n);
        }
        CHECK(!toggled.end_step(n, n > 1), "off: end_step does nothing");
    }
}

// Policy time of one update at the target's shape: 28 evicting layers x 3 kv heads x 128 blocks.
static void test_policy_time() {
    const KvCacheConfig cc = kv_config(30, 3, 64, 9, KvDtype::F16, 64, 8192, 1);  // SmolLM2's shape
    std::mt19937 rng(12);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (bool shared : {false, true}) {
        EvictionConfig c = eviction_config();
        c.per_head_budget = shared;
        c.target_lossy_ratio = 3.0;
        c.layer_start = 2;
        EvictionState s(c, cc);
        EvictionLayerStats st;
        std::vector<std::vector<TokenRun>> plans;
        const int lengths[3] = {8192, 8192, 8192};
        double best = 1e30;
        for (int rep = 0; rep < 20; ++rep) {
            for (int layer = 2; layer < 30; ++layer) {
                float* acc = s.accumulator(layer);
                for (size_t i = 0; i < 3 * s.stride(); ++i) acc[i] = u(rng);
                for (int h = 0; h < 3; ++h) s.record_step(layer, h, 8192, 32);
            }
            const auto t0 = std::chrono::steady_clock::now();
            size_t planned = 0;
            for (int layer = 2; layer < 30; ++layer) {
                s.update_scores(layer, lengths);
                s.plan(layer, 8192, lengths, &plans, &st);
                for (const auto& p : plans) planned += !p.empty();
            }
            best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            CHECK(planned == 84, "every head over budget gets a plan (%zu)", planned);
        }
        std::printf("policy update, 28 layers x 3 heads x 128 blocks%s: %.0f us (best of 20)\n",
                    shared ? ", shared budget" : "", best);
    }
}

int main() {
    test_schedule();
    test_off_is_unchanged();
    test_policy_time();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all h2o schedule tests passed\n");
    return 0;
}
