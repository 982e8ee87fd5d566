// Applying eviction plans: compaction (block-aligned and row moves) checked by reading back and by
// attention against a float64 reference over the kept tokens, scores following the moved blocks,
// an invalid plan changing nothing, and the memory returned (bytes_held and RSS).
#include "eviction_test_support.h"

// Compaction: what is read back is exactly the kept rows, attention equals a float64 reference
// over them, new tokens continue after them, and the freed blocks are accounted for.
static void check_attention_over(KvCache& cache, int layer, const std::vector<std::vector<float>>& k_kept,
                                 const std::vector<std::vector<float>>& v_kept, std::mt19937& rng, const char* what) {
    const KvCacheConfig& c = cache.config();
    const int hd = c.head_dim, G = cache.group();
    for (int n_q : {1, 3}) {
        if (static_cast<size_t>(n_q * hd) > k_kept[0].size()) continue;  // causal: needs n_q tokens
        const std::vector<float> q = random_vec(rng, static_cast<size_t>(n_q) * c.n_heads * hd, 2.f);
        std::vector<float> out(q.size());
        cache.attend(layer, q.data(), n_q, out.data());
        double worst = 0, scale = 0;
        for (int h = 0; h < c.n_kv_heads; ++h) {
            const int len = static_cast<int>(k_kept[h].size() / hd);
            for (int t = 0; t < n_q; ++t)
                for (int g = 0; g < G; ++g) {
                    const float* qr = &q[(static_cast<size_t>(t) * c.n_heads + h * G + g) * hd];
                    const int visible = len - n_q + t + 1;
                    std::vector<double> s(visible);
                    double m = -INFINITY, l = 0;
                    for (int j = 0; j < visible; ++j) {
                        double dot = 0;
                        for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * k_kept[h][static_cast<size_t>(j) * hd + d];
                        s[j] = dot / std::sqrt(static_cast<double>(hd));
                        m = std::max(m, s[j]);
                    }
                    for (double& x : s) l += x = std::exp(x - m);
                    for (int d = 0; d < hd; ++d) {
                        double o = 0;
                        for (int j = 0; j < visible; ++j) o += s[j] / l * v_kept[h][static_cast<size_t>(j) * hd + d];
                        const float got = out[(static_cast<size_t>(t) * c.n_heads + h * G + g) * hd + d];
                        worst = std::max(worst, std::fabs(got - o));
                        scale = std::max(scale, std::fabs(o));
                    }
                }
        }
        CHECK(worst <= 2e-5 * scale, "%s, %d queries: attention err %.3g (scale %.3g)", what, n_q, worst, scale);
    }
}

// True if the head's K blocks, and its V blocks, each lie back to back in memory: compaction packs
// the kept blocks so the attention kernel streams them (KvCache::pack_blocks).
static bool packed(const KvCache& cache, int layer, int h, size_t block_bytes) {
    const KvHeadView view = cache.view(layer, h);
    const int n_blocks = (view.n_keys + cache.config().block_tokens - 1) / cache.config().block_tokens;
    for (const void* const* list : {view.k_blocks, view.v_blocks})
        for (int b = 1; b < n_blocks; ++b)
            if (static_cast<const uint8_t*>(list[b]) != static_cast<const uint8_t*>(list[b - 1]) + block_bytes) return false;
    return true;
}

static void test_compaction(KvDtype dtype) {
    const KvCacheConfig cc = small_config(2, 1024, dtype, 16);
    const size_t block_bytes = static_cast<size_t>(16) * kv_row_bytes(dtype, 32);
    std::mt19937 rng(9);
    struct Case {
        const char* name;
        std::vector<TokenRun> runs;  // for a head of 203 tokens (13 blocks, the last of 11)
        int freed_blocks;
    };
    const std::vector<Case> cases = {
        {"block-aligned", {{0, 32}, {64, 16}, {112, 48}, {192, 11}}, 6},
        {"row moves", {{0, 5}, {9, 1}, {40, 70}, {150, 53}}, 4},
        {"identity", {{0, 203}}, 0},
        {"last token only", {{202, 1}}, 12},
    };
    for (const Case& cs : cases) {
        KvCache cache(cc);
        EvictionConfig c = keep_config(1.0, 1);
        c.sink_tokens = 0;
        c.recent_tokens = 1;
        cache.enable_eviction(c);
        for (int layer = 0; layer < 2; ++layer) {
            step(cache, layer, 150, rng);
            for (int i = 0; i < 53; ++i) step(cache, layer, 1, rng);
        }
        cache.end_step(1, false);  // not due yet (interval 32): nothing folded
        std::vector<std::vector<float>> k_kept(2), v_kept(2);
        std::vector<std::vector<float>> k_all(2), v_all(2);
        for (int h = 0; h < 2; ++h) {
            k_all[h] = read_k(cache, 1, h, &v_all[h]);
            for (const TokenRun& r : cs.runs) {
                k_kept[h].insert(k_kept[h].end(), k_all[h].begin() + r.offset * 32, k_all[h].begin() + (r.offset + r.length) * 32);
                v_kept[h].insert(v_kept[h].end(), v_all[h].begin() + r.offset * 32, v_all[h].begin() + (r.offset + r.length) * 32);
            }
        }
        const size_t held0 = cache.bytes_held();
        for (int h = 0; h < 2; ++h) cache.evict(1, h, cs.runs);
        const int kept = static_cast<int>(k_kept[0].size() / 32);
        for (int h = 0; h < 2; ++h) {
            std::vector<float> v;
            const std::vector<float> k = read_k(cache, 1, h, &v);
            CHECK(cache.length(1, h) == kept, "%s: length %d want %d", cs.name, cache.length(1, h), kept);
            CHECK(k == k_kept[h] && v == v_kept[h], "%s: head %d rows differ from the kept ones", cs.name, h);
            CHECK(packed(cache, 1, h, block_bytes), "%s: head %d kept blocks are not packed", cs.name, h);
        }
        CHECK(held0 - cache.bytes_held() == 2u * 2 * cs.freed_blocks * block_bytes, "%s: freed %zu bytes, want %zu",
              cs.name, held0 - cache.bytes_held(), 2u * 2 * cs.freed_blocks * block_bytes);
        const EvictionStats st = cache.eviction_stats();
        CHECK(st.layers[1].counters.evictions == 2 && st.layers[1].counters.blocks_freed == 4 * cs.freed_blocks,
              "%s: evictions %lld blocks_freed %lld", cs.name, static_cast<long long>(st.layers[1].counters.evictions),
              static_cast<long long>(st.layers[1].counters.blocks_freed));
        CHECK(st.layers[1].bytes_held == static_cast<size_t>(2 * 2 * ((kept + 15) / 16)) * block_bytes, "%s: layer bytes",
              cs.name);
        CHECK(st.layers[0].held[0] == 203 && cache.length(0, 1) == 203, "%s: layer 0 untouched", cs.name);
        check_attention_over(cache, 1, k_kept, v_kept, rng, cs.name);

        // New tokens go after the kept ones, for steps of one and of several tokens.
        for (int n : {1, 20}) {
            const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * 6 * 32);
            const std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * 2 * 32), v = random_vec(rng, k.size());
            std::vector<float> out(q.size());
            cache.step(1, q.data(), k.data(), v.data(), n, out.data());
            for (int h = 0; h < 2; ++h)
                for (int t = 0; t < n; ++t)
                    for (int d = 0; d < 32; ++d) {
                        const size_t src = (static_cast<size_t>(t) * 2 + h) * 32 + d;
                        k_kept[h].push_back(k[src]);
                        v_kept[h].push_back(v[src]);
                    }
        }
        for (int h = 0; h < 2; ++h) {
            std::vector<float> v;
            const std::vector<float> k = read_k(cache, 1, h, &v);
            if (dtype == KvDtype::F32) CHECK(k == k_kept[h] && v == v_kept[h], "%s: rows after appending", cs.name);
            else CHECK(k.size() == k_kept[h].size(), "%s: length after appending", cs.name);
            CHECK(packed(cache, 1, h, block_bytes), "%s: head %d blocks not packed after appending", cs.name, h);
        }
        if (dtype == KvDtype::F32) check_attention_over(cache, 1, k_kept, v_kept, rng, cs.name);
    }
}

// Scores move with their blocks: after a block-aligned plan each kept block keeps its EMA.
static void test_scores_follow_compaction() {
    const KvCacheConfig cc = small_config(1, 1024, KvDtype::F16, 16);
    KvCache cache(cc);
    EvictionConfig c = keep_config(1.0, 0);
    c.update_interval = 1;
    cache.enable_eviction(c);
    std::mt19937 rng(2);
    step(cache, 0, 180, rng);
    step(cache, 0, 1, rng);
    cache.end_step(1, false);  // fold: 12 blocks scored
    int n = 0;
    const std::vector<float> before = cache.eviction_scores(0, &n);
    CHECK(n == 12, "12 blocks");
    const std::vector<TokenRun> runs{{0, 16}, {48, 32}, {128, 53}};  // blocks 0, 3, 4, 8..11
    cache.evict(0, 1, runs);
    int m = 0;
    const std::vector<float> after = cache.eviction_scores(0, &m);
    CHECK(m == 12, "head 0 still holds 12 blocks");
    const int kept_blocks[] = {0, 3, 4, 8, 9, 10, 11};
    for (int j = 0; j < 7; ++j)
        CHECK(after[static_cast<size_t>(m) + j] == before[static_cast<size_t>(n) + kept_blocks[j]], "block %d -> %d score",
              kept_blocks[j], j);
    for (int j = 7; j < 12; ++j) CHECK(std::isnan(after[static_cast<size_t>(m) + j]), "head 1 holds only 7 blocks");
    for (int b = 0; b < 12; ++b) CHECK(after[b] == before[b], "head 0 scores unchanged");
    // A row-moving plan: new block 1 takes 8 tokens of old block 2 and 8 of old block 3.
    cache.evict(0, 0, {{0, 16}, {40, 141}});
    const std::vector<float> mixed = cache.eviction_scores(0, &m);
    const double want = 0.5 * before[2] + 0.5 * before[3];
    CHECK(m == 10 && mixed[0] == before[0], "unmixed block keeps its score");
    CHECK(std::fabs(mixed[1] - want) < 1e-6 * want, "mixed block score %g want %g", mixed[1], want);
}

static void test_invalid_plan_changes_nothing() {
    KvCache cache(small_config(2, 512, KvDtype::F16));
    EvictionConfig c = keep_config(0.5, 1);
    cache.enable_eviction(c);
    std::mt19937 rng(4);
    step(cache, 1, 100, rng);
    const std::vector<float> k0 = read_k(cache, 1, 0);
    const size_t held = cache.bytes_held();
    bool ok = false;
    try {
        cache.evict(1, 0, {{0, 16}, {40, 10}, {80, 20}});  // misses the 32-token recent floor
    } catch (const std::invalid_argument& e) {
        ok = std::string(e.what()).find("recent floor") != std::string::npos;
    }
    CHECK(ok, "invalid plan throws invalid_argument naming the problem");
    CHECK(throws<std::invalid_argument>([&] { cache.evict(1, 0, {{8, 92}}); }), "sink floor");
    CHECK(throws<std::out_of_range>([&] { cache.evict(1, 2, {{0, 100}}); }), "bad head");
    CHECK(throws<std::out_of_range>([&] { cache.evict(2, 0, {{0, 100}}); }), "bad layer");
    CHECK(read_k(cache, 1, 0) == k0 && cache.bytes_held() == held && cache.length(1, 0) == 100, "cache unchanged");
    const EvictionStats st = cache.eviction_stats();
    CHECK(st.layers[1].counters.invalid_plans == 2 && st.layers[1].counters.evictions == 0, "invalid plans counted: %lld",
          static_cast<long long>(st.layers[1].counters.invalid_plans));
    // Without H2O only the last token is a floor.
    cache.disable_eviction();
    cache.evict(1, 0, {{99, 1}});
    CHECK(cache.length(1, 0) == 1, "eviction off: explicit plans still apply");
    CHECK(throws<std::invalid_argument>([&] { cache.eviction_scores(1, nullptr); }), "scores need H2O on");
}

// Evicting most of a long cache gives the memory back: bytes_held exactly, RSS about as much.
static void test_memory_released() {
    const KvCacheConfig cc = kv_config(30, 3, 64, 9, KvDtype::F16, 64, 4096, 1);  // SmolLM2's shape
    KvCache cache(cc);
    EvictionConfig c = eviction_config();  // adaptive 3x over the whole model, layers [2, 30)
    c.target_lossy_ratio = 3.0;
    c.layer_start = 2;
    cache.enable_eviction(c);
    std::mt19937 rng(10);
    const std::vector<float> k = random_vec(rng, static_cast<size_t>(512) * 3 * 64);
    const long rss0 = rss_bytes();
    for (int layer = 0; layer < 30; ++layer)
        for (int t = 0; t < 4096; t += 512) cache.append(layer, k.data(), k.data(), 512);
    const size_t held1 = cache.bytes_held();
    const long rss1 = rss_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(cache.end_step(4096, true), "prefill over budget evicts");
    const double evict_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const size_t held2 = cache.bytes_held();
    const long rss2 = rss_bytes();
    const EvictionStats st = cache.eviction_stats();
    size_t freed = 0;
    for (const auto& l : st.layers) freed += static_cast<size_t>(l.counters.blocks_freed) * 64 * 64 * 2;
    CHECK(held1 - held2 == freed, "bytes_held dropped %zu, blocks_freed say %zu", held1 - held2, freed);
    CHECK(rss1 - rss2 > static_cast<long>(held1 - held2) * 8 / 10, "RSS dropped %ld for %zu bytes freed", rss1 - rss2,
          held1 - held2);
    CHECK(st.lossy_ratio > 2.5 && st.lossy_ratio < 3.5, "lossy ratio %.3f aiming at 3", st.lossy_ratio);
    std::printf("memory: %zu -> %zu bytes held (%.2fx lossy), RSS +%ld MB filled, -%ld MB evicted; "
                "prefill eviction %.2f ms (policy %.0f us, compaction %.0f us)\n",
                held1, held2, st.lossy_ratio, (rss1 - rss0) >> 20, (rss1 - rss2) >> 20, evict_ms, st.policy_us,
                st.compact_us);
}

int main() {
    for (KvDtype dt : {KvDtype::F32, KvDtype::F16}) test_compaction(dt);
    test_scores_follow_compaction();
    test_invalid_plan_changes_nothing();
    test_memory_released();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all h2o compaction tests passed\n");
    return 0;
}
