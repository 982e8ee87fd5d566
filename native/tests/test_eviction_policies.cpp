// The eviction policies: each one's signal deciding what it keeps (in prefill and decode),
// their scores, the shared per-layer selection, and the EMA of normalised scores against an
// independent reference.
#include "eviction_test_support.h"

static void test_policies() {
    const int n = 10;
    const float scores[n] = {5, 0.1f, 0.9f, 0.2f, 0.8f, NAN, 0.3f, 0.7f, 0.4f, 1};
    std::vector<float> prio(n);
    std::vector<uint8_t> keep;
    std::vector<uint64_t> scratch;
    const auto kept = [&]() {
        std::string s;
        for (int b = 0; b < n; ++b) s += keep[b] ? '1' : '0';
        return s;
    };
    const auto select = [&](EvictionPolicy& p, int extra) {
        ScoreContext c;
        c.n_blocks = n;
        c.ema = scores;
        p.rank(c, prio.data());
        std::vector<SelectHead> heads{SelectHead{n, prio.data(), 1, 8, &keep}};
        CHECK(floor_blocks(heads[0]) == 3, "floors: 1 sink + 2 recent");
        select_blocks(heads, extra, &scratch);
        return kept();
    };
    auto eviction = make_policy("h2o", 0);
    CHECK(select(*eviction, 3) == "1010100111", "h2o keeps the top scores: %s", kept().c_str());
    CHECK(select(*eviction, 0) == "1000000011", "h2o with no extra budget keeps the floors: %s", kept().c_str());
    CHECK(select(*eviction, 99) == "1111111111", "h2o with a budget past the candidates keeps all: %s", kept().c_str());
    CHECK(select(*eviction, 6) == "1111101111", "NaN ranks lowest: %s", kept().c_str());
    auto streaming = make_policy("streaming", 0);
    CHECK(select(*streaming, 2) == "1000001111", "streaming keeps the most recent: %s", kept().c_str());

    // Random: a seed gives one sequence, reset() replays it, each candidate is equally likely.
    auto r1 = make_policy("random", 7), r2 = make_policy("random", 7), r3 = make_policy("random", 8);
    const std::string a = select(*r1, 3), b = select(*r2, 3), c = select(*r3, 3);
    CHECK(a == b, "same seed, same choice");
    r1->reset();
    CHECK(select(*r1, 3) == a, "reset replays");
    std::vector<int> hits(n, 0);
    bool differs = a != c;
    const int trials = 4000;
    for (int t = 0; t < trials; ++t) {
        const std::string s = select(*r3, 3);
        differs = differs || s != a;
        for (int i = 0; i < n; ++i) hits[i] += s[i] == '1';
    }
    CHECK(differs, "random choices vary");
    for (int i = 1; i < 8; ++i)  // 3 of 7 candidates each time: expect 3/7 of the trials
        CHECK(std::fabs(hits[i] - trials * 3.0 / 7.0) < 0.06 * trials, "block %d kept %d of %d times", i, hits[i], trials);
    CHECK(throws<std::invalid_argument>([] { make_policy("lru", 0); }), "unknown policy");
}

// A hand-built head of 7 blocks whose signals disagree, evicted to 3 blocks (sink block 0, recent
// block 6 and one more): which middle block each policy keeps shows which signal it reads.
//   block 1: keys along A, the direction of the early queries (most of the prompt): h2o's pick,
//            but its values are ~0, so vatp passes it over
//   block 2: keys along B, the direction of the window's queries but the last: snapkv's and
//            expected attention's pick, and vatp's (block 1's value weight is ~0)
//   block 3: keys along C, the direction of the latest query: tova's pick
//   block 4: keys opposite to every other key's common direction D: keydiff's pick
//   block 5: the most recent candidate: streaming's pick
//
// decode: the prompt stays (below the trigger) and 8 decode tokens follow, the first 7 querying C,
// the last B; the update after them is the first: the window holds the 8 decode queries.
static int kept_middle_block(const std::string& policy, KvDtype dtype, bool decode = false) {
    KvCacheConfig cc;
    cc.n_layers = 1;
    cc.n_kv_heads = 1;
    cc.head_dim = 32;
    cc.n_heads = 2;
    cc.dtype = dtype;
    cc.block_tokens = 16;
    cc.max_tokens = 256;
    cc.threads = 1;
    KvCache cache(cc);
    EvictionConfig c = eviction_config();
    c.policy = policy;
    c.target_keep_ratio = 3.0 / 7.0;
    c.target_lossy_ratio = 0.0;
    c.layer_start = 0;
    c.sink_tokens = 16;
    c.recent_tokens = 16;
    c.trigger_min_tokens = 0;
    c.observation_window = 8;
    if (decode) {
        c.trigger_min_tokens = 120;
        c.update_interval = 8;
    }
    cache.enable_eviction(c);
    const int n = 112, hd = 32;
    std::mt19937 rng(5);
    std::normal_distribution<float> noise(0.f, 0.1f);
    std::vector<float> q(static_cast<size_t>(n) * 2 * hd), k(static_cast<size_t>(n) * hd), v(k.size());
    enum { A = 0, B = 1, C = 2, D = 3 };
    for (int t = 0; t < n; ++t) {
        const int b = t / 16;
        float* kt = &k[static_cast<size_t>(t) * hd];
        for (int d = 0; d < hd; ++d) kt[d] = noise(rng), v[static_cast<size_t>(t) * hd + d] = b == 1 ? 0.01f * noise(rng) : 1.f + noise(rng);
        kt[D] += b == 4 ? -3.f : 2.f;
        if (b == 1) kt[A] += 5.f;
        if (b == 2) kt[B] += 5.f;
        if (b == 3) kt[C] += 5.f;
        for (int g = 0; g < 2; ++g) {
            float* qt = &q[(static_cast<size_t>(t) * 2 + g) * hd];
            for (int d = 0; d < hd; ++d) qt[d] = noise(rng);
            qt[t == n - 1 ? C : t >= n - 8 ? B : A] += 3.f;
        }
    }
    std::vector<float> out(q.size());
    cache.step(0, q.data(), k.data(), v.data(), n, out.data());
    cache.end_step(n, true);
    for (int t = 0; decode && t < 8; ++t) {
        float* kt = &k[0];  // token 0's row (block 0, not compared below) as scratch: an ordinary key
        for (int d = 0; d < hd; ++d) kt[d] = noise(rng), v[d] = 1.f + noise(rng);
        kt[D] += 2.f;
        for (int g = 0; g < 2; ++g) {
            for (int d = 0; d < hd; ++d) q[g * hd + d] = noise(rng);
            q[g * hd + (t == 7 ? B : C)] += 3.f;
        }
        cache.step(0, q.data(), kt, v.data(), 1, out.data());
        if (cache.end_step(1, false) != (t == 7)) return -1000;  // nothing evicted before the 8th
    }
    if (cache.length(0, 0) != (decode ? 56 : 48)) return -cache.length(0, 0);
    // Which original block do the kept tokens 16..31 come from (nearest, so quantised types work)?
    const std::vector<float> kept = read_k(cache, 0, 0);
    int best = -1;
    double best_d = 1e30;
    for (int b = 1; b < 6; ++b) {
        double dist = 0;
        for (int i = 0; i < 16 * hd; ++i) {
            const double e = kept[16 * hd + i] - k[static_cast<size_t>(b) * 16 * hd + i];
            dist += e * e;
        }
        if (dist < best_d) best_d = dist, best = b;
    }
    return best;
}

static void test_policy_signals() {
    const std::pair<const char*, int> want[] = {{"h2o", 1},  {"snapkv", 2},    {"tova", 3},
                                                {"keydiff", 4}, {"vatp", 2},  {"expected_attention", 2},
                                                {"streaming", 5}};
    for (KvDtype dt : {KvDtype::F32, KvDtype::F16, KvDtype::Q8R}) {
        for (const auto& [name, block] : want) {
            const int got = kept_middle_block(name, dt);
            CHECK(got == block, "%s (%s) keeps block %d, want %d", name, kv_dtype_name(dt), got, block);
        }
        const int r = kept_middle_block("random", dt);
        CHECK(r >= 1 && r <= 5, "random keeps one middle block (%d)", r);
    }
    // In decode the window is the queries since the last update (here the 8 decode ones).
    const std::pair<const char*, int> decode_want[] = {{"h2o", 1}, {"snapkv", 3}, {"tova", 2},
                                                       {"expected_attention", 3}, {"keydiff", 4}, {"streaming", 5}};
    for (KvDtype dt : {KvDtype::F32, KvDtype::Q8R}) {
        for (const auto& [name, block] : decode_want) {
            const int got = kept_middle_block(name, dt, true);
            CHECK(got == block, "decode: %s (%s) keeps block %d, want %d", name, kv_dtype_name(dt), got, block);
        }
    }
    // Every registry name makes a policy; each appears once.
    for (const std::string& name : policy_list()) CHECK(make_policy(name, 0) != nullptr, "make %s", name.c_str());
    CHECK(policy_list().size() == static_cast<size_t>(schema::eviction::policy::kChoiceCount) && policy_list()[0] == "h2o",
          "the schema's policies, h2o first");
}

// The scores of the policies that are not attention probabilities are distributions over the
// head's blocks, so a shared layer budget compares heads on one scale; expected attention's
// variance term counts; vatp keeps the EMA's scale.
static void test_policy_scores() {
    const int hd = 16, bt = 16, n = 40, nb = 3;
    std::mt19937 rng(3);
    std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * hd), v = random_vec(rng, k.size());
    const float ema[nb] = {0.5f, 0.3f, 0.2f};
    ScoreContext c;
    c.n_blocks = nb;
    c.block_tokens = bt;
    c.length = n;
    c.head_dim = hd;
    c.group = 2;
    c.ema = ema;
    c.k_rows = k.data();
    c.v_rows = v.data();
    std::vector<float> mean(2 * hd, 0.f), var(2 * hd, 0.f);
    c.q_mean = mean.data();
    c.q_var = var.data();
    c.q_count = 4;
    std::vector<float> prio(nb);
    for (const char* name : {"keydiff", "expected_attention"}) {
        make_policy(name, 0)->rank(c, prio.data());
        double sum = 0;
        for (float p : prio) {
            sum += p;
            CHECK(p >= 0.f, "%s: priority >= 0", name);
        }
        CHECK(std::fabs(sum - 1.0) < 1e-5, "%s: priorities sum to %.6f, want 1", name, sum);
    }
    // Zero mean and variance: every key equally likely, so a block's share is its tokens' share.
    make_policy("expected_attention", 0)->rank(c, prio.data());
    CHECK(std::fabs(prio[0] - 0.4f) < 1e-5 && std::fabs(prio[2] - 0.2f) < 1e-5, "uniform expectation: %g %g", prio[0],
          prio[2]);
    // Variance along dimension 0 favours the keys with large |k_0| (block 2 here), mean or not.
    for (int t = 32; t < n; ++t) k[static_cast<size_t>(t) * hd] = 6.f;
    for (int t = 0; t < 32; ++t) k[static_cast<size_t>(t) * hd] = 0.f;
    var[0] = var[hd] = 4.f;
    make_policy("expected_attention", 0)->rank(c, prio.data());
    CHECK(prio[2] > prio[0] && prio[2] > prio[1], "variance term: %g %g %g", prio[0], prio[1], prio[2]);
    // vatp: equal value norms leave the EMA as it is.
    for (float& x : v) x = 1.f;
    make_policy("vatp", 0)->rank(c, prio.data());
    for (int b = 0; b < nb; ++b) CHECK(std::fabs(prio[b] - ema[b]) < 1e-6, "vatp with equal norms: %g", prio[b]);
}

// A budget shared by the heads of a layer goes to the head whose attention is spread out.
static void test_shared_budget_selection() {
    const int n = 8;
    const float focused[n] = {0.5f, 0.4f, 0.01f, 0.01f, 0.01f, 0.01f, 0.02f, 0.04f};
    const float spread[n] = {0.1f, 0.12f, 0.13f, 0.11f, 0.14f, 0.12f, 0.13f, 0.15f};
    std::vector<uint8_t> k0, k1;
    std::vector<uint64_t> scratch;
    std::vector<SelectHead> heads{SelectHead{n, focused, 1, 7, &k0}, SelectHead{n, spread, 1, 7, &k1}};
    select_blocks(heads, 4, &scratch);  // 2 floors each, 4 more between them
    const int kept0 = static_cast<int>(std::count(k0.begin(), k0.end(), 1));
    const int kept1 = static_cast<int>(std::count(k1.begin(), k1.end(), 1));
    CHECK(kept0 == 3 && kept1 == 5, "shared budget: focused head keeps %d, spread head %d", kept0, kept1);
    CHECK(k0[1] == 1, "the focused head keeps its heavy hitter");
}

// The EMA of normalised block scores, against a reference that collects the raw masses through
// the plain attention API and counts visibility query by query.
static void test_scores_against_reference() {
    const KvCacheConfig cc = small_config(2, 512, KvDtype::F32, 16);
    KvCache with(cc), plain(cc);
    EvictionConfig c = keep_config(1.0, 1);  // keep everything: scores only
    c.ema_alpha = 0.25;
    c.update_interval = 3;
    with.enable_eviction(c);
    const int nkv = cc.n_kv_heads, G = cc.n_heads / cc.n_kv_heads, mb = plain.max_blocks();
    std::vector<double> mass(static_cast<size_t>(nkv) * mb, 0.0), seen(mass.size(), 0.0), ema(mass.size(), 0.0);
    int scored = 0;
    std::mt19937 rng(5);
    std::vector<float> scratch(mass.size());
    const auto run = [&](int n) {
        const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * cc.n_heads * cc.head_dim, 3.f);
        const std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * nkv * cc.head_dim);
        std::vector<float> o1(q.size()), o2(q.size());
        with.step(1, q.data(), k.data(), k.data(), n, o1.data());
        std::fill(scratch.begin(), scratch.end(), 0.f);
        plain.step(1, q.data(), k.data(), k.data(), n, o2.data(), scratch.data(), mb);
        CHECK(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)) == 0, "collecting scores changed the output");
        const int len = plain.length(1, 0);
        for (size_t i = 0; i < mass.size(); ++i) mass[i] += scratch[i];
        for (int h = 0; h < nkv; ++h)
            for (int i = 0; i < n; ++i)                      // query i is at position len - n + i
                for (int b = 0; b * 16 <= len - n + i; ++b)  // and sees the blocks starting at or before it
                    seen[static_cast<size_t>(h) * mb + b] += G;
    };
    const auto fold = [&]() {
        const int n_blocks = (plain.length(1, 0) + 15) / 16;
        for (int h = 0; h < nkv; ++h)
            for (int b = 0; b < n_blocks; ++b) {
                const size_t i = static_cast<size_t>(h) * mb + b;
                const double mean = mass[i] / seen[i];
                ema[i] = b < scored ? 0.25 * ema[i] + 0.75 * mean : mean;
                mass[i] = seen[i] = 0.0;
            }
        scored = n_blocks;
    };
    const auto compare = [&](const char* when) {
        int n = 0;
        const std::vector<float> got = with.eviction_scores(1, &n);
        CHECK(n == scored, "%s: %d blocks, want %d", when, n, scored);
        double worst = 0;
        for (int h = 0; h < nkv; ++h)
            for (int b = 0; b < n; ++b) {
                const double want = ema[static_cast<size_t>(h) * mb + b];
                worst = std::max(worst, std::fabs(got[static_cast<size_t>(h) * n + b] - want) / (want + 1e-9));
            }
        CHECK(worst < 1e-5, "%s: EMA rel err %.3g", when, worst);
    };
    // Chunked prefill (partial visibility), then decode tokens; updates every 3 decode tokens.
    run(37);
    run(50);
    CHECK(!with.end_step(50, true), "prefill within budget: no update");
    for (int i = 0; i < 3; ++i) {
        run(1);
        with.end_step(1, false);
    }
    fold();
    compare("first update (prompt + 3 tokens)");
    // Decode steps, one of several tokens: the schedule counts tokens, not calls.
    int pending = 0;
    for (int n : {1, 1, 1, 1, 5, 1, 1}) {
        run(n);
        CHECK(!with.end_step(n, false), "nothing to evict");
        pending += n;
        if (pending >= 3) {
            fold();
            compare("a later update");
            pending %= 3;
        }
    }
    CHECK(with.eviction_stats().updates == 3, "3 updates, got %lld", static_cast<long long>(with.eviction_stats().updates));
    int n = 0;
    const std::vector<float> layer0 = with.eviction_scores(0, &n);
    CHECK(n == 0 && layer0.empty(), "layer outside the range holds nothing here");
}

int main() {
    test_policies();
    test_policy_signals();
    test_policy_scores();
    test_shared_budget_selection();
    test_scores_against_reference();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all h2o policy tests passed\n");
    return 0;
}
