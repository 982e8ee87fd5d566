// H2O budgets: the static and adaptive (lossy ratio) arithmetic, the sink/recent floors and their
// share, the pyramid layer budget and the byte budget.
#include "eviction_test_support.h"

static void test_budgets() {
    KvCacheConfig cc = small_config(30, 4096);
    EvictionConfig c = eviction_config();  // adaptive, lossy 3, layers [2, 30)
    c.target_lossy_ratio = 3.0;
    c.layer_start = 2;
    EvictionState s(c, cc);
    const double k = (30.0 / 3.0 - 2.0) / 28.0;
    CHECK(std::fabs(s.keep_ratio() - k) < 1e-12, "adaptive keep ratio %f, want %f", s.keep_ratio(), k);
    CHECK(s.budget_blocks(2048) == static_cast<int>(std::ceil(k * 2048 / 16)), "budget %d", s.budget_blocks(2048));
    CHECK(EvictionState(keep_config(1.0), cc).budget_blocks(1001) == 63, "keep ratio 1 keeps a partial last block");
    c.layer_start = 0;
    CHECK(std::fabs(EvictionState(c, cc).keep_ratio() - 1.0 / 3.0) < 1e-12, "all layers evicting: 1/R");
    c.layer_start = 20;  // 10 evicting layers cannot reach 3x: 20 layers already hold 2/3 of 1/3
    CHECK(EvictionState(c, cc).keep_ratio() <= 0.0, "unreachable target gives k <= 0");
    c = keep_config(0.25);
    CHECK(EvictionState(c, cc).keep_ratio() == 0.25 && EvictionState(c, cc).budget_blocks(1000) == 16, "static budget");

    // Skip reasons are counted per head and update.
    KvCache cache(small_config(3, 1024));
    std::mt19937 rng(1);
    EvictionConfig u = eviction_config();
    u.layer_start = 1;
    u.target_lossy_ratio = 10.0;  // 3 layers, 2 evicting: k = (0.3 - 1) / 2 < 0
    u.sink_tokens = 16;
    u.recent_tokens = 32;
    u.trigger_min_tokens = 100;
    cache.enable_eviction(u);
    for (int layer = 0; layer < 3; ++layer) step(cache, layer, 200, rng);
    CHECK(!cache.end_step(200, true), "unreachable target: nothing evicted");
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    EvictionStats st = cache.eviction_stats();
    CHECK(st.layers[1].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)] == 2,
          "target_unreachable counted per head: %lld",
          static_cast<long long>(st.layers[1].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)]));
    CHECK(st.layers[0].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)] == 0, "layer 0 not evicting");
    CHECK(st.updates == 1, "one decode update, got %lld", static_cast<long long>(st.updates));

    u.target_lossy_ratio = 0.0;
    u.target_keep_ratio = 0.1;  // at 264 tokens: 26.4 tokens -> 2 blocks < 1 sink + 3 recent floor blocks
    u.max_floor_share = 0.0;    // the old rule: such a head is left alone
    cache.enable_eviction(u);
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    st = cache.eviction_stats();
    CHECK(st.layers[2].counters.skipped[static_cast<int>(SkipReason::FloorsExceedTarget)] == 2, "floors_exceed_target");
    CHECK(cache.length(2, 0) == 264, "nothing evicted when floors exceed the budget");

    u.trigger_min_tokens = 1000;
    cache.enable_eviction(u);
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    CHECK(cache.eviction_stats().layers[1].counters.skipped[static_cast<int>(SkipReason::BelowTrigger)] == 2, "below_trigger");
}

// Floors larger than the budget shrink in proportion (eviction.max_floor_share), so the target is met.
// PyramidKV budgets: decreasing linearly with depth, the same mean as the uniform keep ratio,
// flat when the last layer would fall below its floors.
static void test_pyramid_budget() {
    KvCacheConfig cc = small_config(30, 8192);
    EvictionConfig c = keep_config(0.3);
    c.sink_tokens = 64;
    c.recent_tokens = 256;
    c.layer_budget = "pyramid";
    EvictionState s(c, cc);
    double sum = 0;
    for (int l = 0; l < 30; ++l) {
        const double k = s.layer_keep_ratio(l, 4096);
        sum += k;
        if (l > 0) CHECK(k < s.layer_keep_ratio(l - 1, 4096), "layer %d: decreasing", l);
    }
    CHECK(std::fabs(sum / 30 - 0.3) < 1e-12, "pyramid mean %.6f, want 0.3", sum / 30);
    CHECK(std::fabs(s.layer_keep_ratio(0, 4096) - 0.45) < 1e-12 && std::fabs(s.layer_keep_ratio(29, 4096) - 0.15) < 1e-12,
          "slope 1/2: %f .. %f", s.layer_keep_ratio(0, 4096), s.layer_keep_ratio(29, 4096));
    CHECK(s.budget_blocks(4096, 0) == 116 && s.budget_blocks(4096, 29) == 39 && s.budget_blocks(4096) == 77,
          "pyramid budgets %d %d %d", s.budget_blocks(4096, 0), s.budget_blocks(4096, 29), s.budget_blocks(4096));
    // 320 floor tokens of 0.3 * 1000: the last layer would fall below them, so no slope.
    CHECK(s.layer_keep_ratio(0, 1000) == 0.3 && s.layer_keep_ratio(29, 1000) == 0.3, "flat below the floors");
    // At 1200 tokens the slope is what keeps the last layer at its floors exactly.
    CHECK(std::fabs(s.layer_keep_ratio(29, 1200) * 1200 - 320) < 1e-9, "last layer at its floors");
    c.layer_budget = "uniform";
    CHECK(EvictionState(c, cc).layer_keep_ratio(0, 4096) == 0.3, "uniform");
    c.layer_budget = "cone";
    CHECK(eviction_config_error(c, 30).rfind("layer_budget", 0) == 0, "bad layer_budget named");
}

// eviction.kv_budget_bytes: the whole model's K and V blocks stay within the cap after the prompt's cut
// and through decode updates, for f16 and for q8 (whose smaller rows fit more tokens in it).
// A byte cap on the whole model (no ratio target), small floors, from the first token on.
static EvictionConfig byte_cap_config(int64_t bytes) {
    EvictionConfig c = small_floors_config();
    c.kv_budget_bytes = bytes;
    return c;
}

static void test_byte_budget() {
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8}) {
        KvCacheConfig cc = small_config(4, 2048, dt);
        KvCache cache(cc);
        EvictionConfig c = byte_cap_config(400 * 1024);
        c.layer_start = 1;
        c.update_interval = 8;
        cache.enable_eviction(c);
        std::mt19937 rng(2);
        for (int layer = 0; layer < 4; ++layer) step(cache, layer, 1000, rng);
        const size_t full = cache.pool_bytes_held();
        CHECK(cache.end_step(1000, true), "%s: the prompt is over the cap", kv_dtype_name(dt));
        const size_t cut = cache.pool_bytes_held();
        CHECK(cut <= static_cast<size_t>(c.kv_budget_bytes) && cut > static_cast<size_t>(c.kv_budget_bytes) * 9 / 10,
              "%s: %zu -> %zu bytes held, cap %lld", kv_dtype_name(dt), full, cut, static_cast<long long>(c.kv_budget_bytes));
        for (int t = 0; t < 64; ++t) {
            for (int layer = 0; layer < 4; ++layer) step(cache, layer, 1, rng);
            cache.end_step(1, false);
            if (t % 8 == 7)
                CHECK(cache.pool_bytes_held() <= static_cast<size_t>(c.kv_budget_bytes), "%s: decode %d: %zu bytes held",
                      kv_dtype_name(dt), t, cache.pool_bytes_held());
        }
        if (dt == KvDtype::Q8) {
            int held = 0;
            for (int h = 0; h < 2; ++h) held += cache.length(3, h);
            CHECK(held > 2 * 300, "q8 keeps more tokens under the same cap (%d)", held);
        }
    }
    // A cap the layers that keep everything already exceed cannot be met: left alone, said why.
    KvCache cache(small_config(4, 2048));
    EvictionConfig c = eviction_config();
    c.target_lossy_ratio = 0.0;
    c.kv_budget_bytes = 1024;
    c.trigger_min_tokens = 0;
    cache.enable_eviction(c);
    std::mt19937 rng(3);
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 300, rng);
    CHECK(!cache.end_step(300, true), "unreachable cap: no eviction");
}

static void test_floor_share() {
    // Static keep 0.1 of 1024 tokens: 7 blocks; floors 64 + 256 tokens = 4 + 16 blocks.
    const KvCacheConfig cc = small_config(3, 1024);
    EvictionConfig c = keep_config(0.1, 1);
    c.sink_tokens = 64;
    c.recent_tokens = 256;
    int sink = -1, recent = -1;
    EvictionState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    // cap 7 blocks: recent round(16 * 7 / 20) = 6 blocks, sink the 1 block left.
    CHECK(sink == 16 && recent == 96, "share 1: floors %d + %d tokens, want 16 + 96", sink, recent);
    EvictionState(c, cc).floor_tokens(1024, 1000, &sink, &recent);  // partial last block: 6 blocks = 88 tokens
    CHECK(sink == 16 && recent == 88, "share 1, 1000 tokens: floors %d + %d, want 16 + 88", sink, recent);
    EvictionState(c, cc).floor_tokens(10240, 1024, &sink, &recent);  // budget 64 blocks: floors fit
    CHECK(sink == 64 && recent == 256, "floors within the budget stay: %d + %d", sink, recent);
    c.max_floor_share = 0.5;
    c.target_keep_ratio = 0.25;  // 16 blocks, floors at most 8: recent round(16 * 8 / 20) = 6, sink 2
    EvictionState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    CHECK(sink == 32 && recent == 96, "share 0.5: floors %d + %d tokens, want 32 + 96", sink, recent);
    c.max_floor_share = 0.0;
    EvictionState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    CHECK(sink == 64 && recent == 256, "share 0: floors never shrink (%d + %d)", sink, recent);

    for (const double share : {1.0, 0.5, 0.0}) {
        KvCache cache(cc);
        EvictionConfig u = keep_config(share == 0.5 ? 0.25 : 0.1, 1);
        u.sink_tokens = 64;
        u.recent_tokens = 256;
        u.max_floor_share = share;
        cache.enable_eviction(u);
        std::mt19937 rng(7);
        std::vector<std::vector<float>> k_before(2), v_before(2);
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1024, rng);
        for (int h = 0; h < 2; ++h) k_before[h] = read_k(cache, 2, h, &v_before[h]);
        const bool evicted = cache.end_step(1024, true);  // valid plans, or evict() throws
        const EvictionStats st = cache.eviction_stats();
        const int64_t floors_exceed = st.layers[2].counters.skipped[static_cast<int>(SkipReason::FloorsExceedTarget)];
        if (share == 0.0) {
            CHECK(!evicted && cache.length(2, 0) == 1024 && floors_exceed == 2, "share 0: head left alone");
            continue;
        }
        const int want = share == 1.0 ? 7 * 16 : 16 * 16;
        for (int h = 0; h < 2; ++h) {
            CHECK(cache.length(2, h) == want, "share %g: head %d holds %d tokens, want %d (the budget)", share, h,
                  cache.length(2, h), want);
            const std::vector<float> k = read_k(cache, 2, h);
            const int hd = cc.head_dim, sink_rows = share == 1.0 ? 16 : 32;
            // The shrunk floors are the first sink_rows and the last 96 tokens.
            CHECK(std::equal(k.begin(), k.begin() + sink_rows * hd, k_before[h].begin()), "share %g: sink kept", share);
            CHECK(std::equal(k.end() - 96 * hd, k.end(), k_before[h].end() - 96 * hd), "share %g: recent kept", share);
        }
        CHECK(floors_exceed == 0 && st.layers[2].counters.invalid_plans == 0, "share %g: no skips, no invalid plans",
              share);
        CHECK(cache.length(0, 0) == 1024, "layer 0 does not evict");
    }

    // Whole model: 16 layers, 15 evicting, target 8x with the default floors (64 + 256 tokens)
    // over a 2048-token prompt in 256-token chunks: keep 1/15, 9 blocks per head < 20 floor blocks.
    KvCache cache(small_config(16, 2048));
    EvictionConfig w = eviction_config();
    w.layer_start = 1;
    w.target_lossy_ratio = 8.0;
    w.trigger_min_tokens = 512;  // below the prompt, so it is cut
    cache.enable_eviction(w);
    std::mt19937 rng(3);
    for (int chunk = 0; chunk < 8; ++chunk) {
        for (int layer = 0; layer < 16; ++layer) step(cache, layer, 256, rng);
        cache.end_step(256, true);
    }
    const double ratio = cache.eviction_stats().lossy_ratio;
    // 16 * 2048 / (2048 + 15 * 9 * 16) = 7.79 (block rounding of the 8.53-block budget).
    CHECK(ratio > 7.7 && ratio <= 8.0, "8x with floors larger than the budget: whole-model ratio %.3f", ratio);
    // Decode: the heads now hold 144 tokens, below trigger_min_tokens (512); the trigger counts
    // the tokens the layer has seen, so they are still held to their budget.
    KvCache small(small_config(16, 2048 + 64));
    small.enable_eviction(w);
    for (int chunk = 0; chunk < 8; ++chunk) {
        for (int layer = 0; layer < 16; ++layer) step(small, layer, 256, rng);
        small.end_step(256, true);
    }
    for (int t = 0; t < 64; ++t) {
        for (int layer = 0; layer < 16; ++layer) step(small, layer, 1, rng);
        small.end_step(1, false);
    }
    const double after = small.eviction_stats().lossy_ratio;
    CHECK(after > 7.6 && after <= 8.0 && small.length(5, 0) <= 10 * 16, "after 64 decode tokens: ratio %.3f, %d held",
          after, small.length(5, 0));
}

// Sliding-window layers (Gemma 3's local layers) under eviction: it acts on the global layers
// alone, a ratio target is theirs (the window layers hold their window whatever it is), a byte
// cap counts the windows' blocks, and a range of window layers only is refused.
static void test_window_layers() {
    const int W = 64, bt = 16;
    KvCacheConfig cc = small_config(6, 4096, KvDtype::F16, bt);
    cc.windows = {W, W, 0, W, W, 0};
    {
        KvCache cache(cc);
        EvictionConfig c = eviction_config();
        c.target_lossy_ratio = 2.0;
        c.sink_tokens = 16;
        c.recent_tokens = 32;
        c.trigger_min_tokens = 0;
        cache.enable_eviction(c);
        std::mt19937 rng(11);
        for (int chunk = 0; chunk < 2; ++chunk) {
            for (int layer = 0; layer < 6; ++layer) step(cache, layer, 512, rng);
            cache.end_step(512, true);
        }
        for (int layer = 0; layer < 6; ++layer) {
            for (int h = 0; h < 2; ++h) {
                const int held = cache.length(layer, h);
                if (cc.windows[layer]) {
                    CHECK(held >= W - 1 && held < W - 1 + bt, "window layer %d head %d holds %d", layer, h, held);
                } else {
                    // k = (2 / 2 - 0) / 2 of 1024 tokens, in whole blocks
                    CHECK(held <= 512 && held > 512 - 2 * bt, "global layer %d head %d holds %d", layer, h, held);
                }
            }
            const EvictionStats st = cache.eviction_stats();
            CHECK((st.layers[layer].counters.evictions > 0) == !cc.windows[layer], "layer %d: %lld plans", layer,
                  static_cast<long long>(st.layers[layer].counters.evictions));
        }
        // Decode: the windows move on, the global layers stay near their budget.
        for (int t = 0; t < 40; ++t) {
            for (int layer = 0; layer < 6; ++layer) step(cache, layer, 1, rng);
            cache.end_step(1, false);
        }
        CHECK(cache.length(0, 0) < W - 1 + bt && cache.length(2, 0) <= (1024 + 40) / 2 + bt, "after decode: %d / %d",
              cache.length(0, 0), cache.length(2, 0));
        // The whole-model figures count a window layer at its window (what it holds uncompressed).
        const EvictionStats st = cache.eviction_stats();
        const size_t row = kv_row_bytes(KvDtype::F16, 32) * 2 * 2;
        CHECK(st.bytes_uncompressed == row * (4 * W + 2 * (1024 + 40)), "bytes_uncompressed %zu", st.bytes_uncompressed);
    }
    {
        // A byte cap: the window layers' blocks are what they are, the global layers get the rest.
        KvCache cache(cc);
        EvictionConfig c = byte_cap_config(120 * 1024);
        cache.enable_eviction(c);
        std::mt19937 rng(12);
        for (int layer = 0; layer < 6; ++layer) step(cache, layer, 1000, rng);
        CHECK(cache.end_step(1000, true), "over the cap");
        CHECK(cache.pool_bytes_held() <= static_cast<size_t>(c.kv_budget_bytes) &&
                  cache.pool_bytes_held() > static_cast<size_t>(c.kv_budget_bytes) * 8 / 10,
              "%zu bytes held, cap %lld", cache.pool_bytes_held(), static_cast<long long>(c.kv_budget_bytes));
    }
    {
        // Pyramid budgets rank the global layers among themselves.
        KvCache cache(cc);
        EvictionConfig c = keep_config(0.5);
        c.layer_budget = "pyramid";
        cache.enable_eviction(c);
        std::mt19937 rng(13);
        for (int layer = 0; layer < 6; ++layer) step(cache, layer, 600, rng);
        cache.end_step(600, true);
        CHECK(cache.length(2, 0) > cache.length(5, 0), "pyramid: the first global layer keeps more (%d vs %d)",
              cache.length(2, 0), cache.length(5, 0));
    }
    KvCache cache(cc);
    EvictionConfig c = eviction_config();
    c.layer_start = 0;
    c.layer_end = 2;  // window layers only
    CHECK(throws<std::invalid_argument>([&] { cache.enable_eviction(c); }), "a range of window layers only");
}

int main() {
    test_window_layers();
    test_budgets();
    test_floor_share();
    test_pyramid_budget();
    test_byte_budget();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all h2o budget tests passed\n");
    return 0;
}
