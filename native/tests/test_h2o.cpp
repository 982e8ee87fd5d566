// One file: one ctest program for H2O eviction; its cases share the cache helpers below.
// H2O eviction: config validation, plan validation, the policies (each one's signal deciding what it
// keeps, in prefill and decode) and the shared per-layer budget, budget arithmetic (static and adaptive), floors, the EMA of normalised scores against
// an independent reference, the decode-token schedule, compaction (block-aligned and row moves)
// checked by reading back and by attention against a float64 reference over the kept tokens,
// memory returned (bytes_held and RSS), eviction off = unchanged outputs, and policy timing.
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
#include "mnn_h2o/eviction/h2o_config.h"
#include "mnn_h2o/eviction/h2o_state.h"
#include "mnn_h2o/cache/kv_cache.h"

#include "test_support.h"

using namespace mnn_h2o;

static KvCacheConfig small_config(int n_layers, int max_tokens, KvDtype dtype = KvDtype::F32, int block_tokens = 16) {
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
static void step(KvCache& cache, int layer, int n, std::mt19937& rng, std::vector<float>* out = nullptr) {
    const KvCacheConfig& c = cache.config();
    const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * c.n_heads * c.head_dim, 2.f);
    const std::vector<float> k = random_vec(rng, static_cast<size_t>(n) * c.n_kv_heads * c.head_dim);
    const std::vector<float> v = random_vec(rng, k.size());
    std::vector<float> o(q.size());
    cache.step(layer, q.data(), k.data(), v.data(), n, o.data());
    if (out) *out = o;
}

static std::vector<float> read_k(const KvCache& cache, int layer, int h, std::vector<float>* v_out = nullptr) {
    const int n = cache.length(layer, h), hd = cache.config().head_dim;
    std::vector<float> k(static_cast<size_t>(n) * hd), v(k.size());
    cache.read(layer, h, k.data(), v.data());
    if (v_out) *v_out = v;
    return k;
}

static H2oConfig keep_config(double keep_ratio, int layer_start = 0) {
    H2oConfig c;
    c.target_keep_ratio = keep_ratio;
    c.target_lossy_ratio = 0.0;
    c.layer_start = layer_start;
    c.sink_tokens = 16;
    c.recent_tokens = 32;
    c.trigger_min_tokens = 0;
    return c;
}

static void test_config_validation() {
    CHECK(h2o_config_error(H2oConfig{}, 30).empty(), "defaults are valid: %s", h2o_config_error(H2oConfig{}, 30).c_str());
    const auto bad = [](const char* field, auto mutate, int n_layers = 30) {
        H2oConfig c;
        mutate(c);
        const std::string e = h2o_config_error(c, n_layers);
        CHECK(e.rfind(field, 0) == 0, "bad %s gave '%s'", field, e.c_str());
        CHECK(throws<std::invalid_argument>([&] { resolved(c, n_layers); }), "resolved(%s) did not throw", field);
    };
    bad("policy", [](H2oConfig& c) { c.policy = "lru"; });
    bad("max_floor_share", [](H2oConfig& c) { c.max_floor_share = 1.5; });
    bad("max_floor_share", [](H2oConfig& c) { c.max_floor_share = -0.1; });
    bad("max_floor_share", [](H2oConfig& c) { c.max_floor_share = std::nan(""); });
    bad("sink_tokens", [](H2oConfig& c) { c.sink_tokens = -1; });
    bad("recent_tokens", [](H2oConfig& c) { c.recent_tokens = 0; });
    bad("target_keep_ratio", [](H2oConfig& c) { c.target_keep_ratio = 1.5; });
    bad("target_keep_ratio", [](H2oConfig& c) { c.target_keep_ratio = NAN; });
    bad("target_lossy_ratio", [](H2oConfig& c) { c.target_lossy_ratio = 0.5; });
    bad("target_lossy_ratio", [](H2oConfig& c) { c.target_lossy_ratio = INFINITY; });
    bad("target_lossy_ratio", [](H2oConfig& c) { c.target_lossy_ratio = 1000.5; });
    // The budget: a keep ratio or a byte cap (at most one) replaces the lossy ratio, whatever its
    // value; without either the lossy ratio is the target and must be a real ratio.
    bad("target_keep_ratio and kv_budget_bytes", [](H2oConfig& c) {
        c.target_keep_ratio = 0.5;
        c.kv_budget_bytes = 1 << 20;
    });
    bad("target_lossy_ratio", [](H2oConfig& c) { c.target_lossy_ratio = 0.0; });
    for (const double lossy : {0.0, 0.5, 3.0}) {
        H2oConfig keep, cap;
        keep.target_keep_ratio = 0.5;
        keep.target_lossy_ratio = lossy;
        cap.kv_budget_bytes = 1 << 20;
        cap.target_lossy_ratio = lossy;
        CHECK(h2o_config_error(keep, 30).empty(), "keep ratio with lossy %g: %s", lossy, h2o_config_error(keep, 30).c_str());
        CHECK(h2o_config_error(cap, 30).empty(), "byte cap with lossy %g: %s", lossy, h2o_config_error(cap, 30).c_str());
    }
    bad("kv_budget_bytes", [](H2oConfig& c) { c.kv_budget_bytes = -1; });
    bad("kv_budget_bytes", [](H2oConfig& c) { c.kv_budget_bytes = schema::h2o::kv_budget_bytes::kHi + 1; });
    bad("seed", [](H2oConfig& c) { c.seed = uint64_t{1} << 31; });
    bad("sink_tokens", [](H2oConfig& c) { c.sink_tokens = (1 << 20) + 1; });
    bad("layer_budget", [](H2oConfig& c) { c.layer_budget = "cone"; });
    bad("head_floor_share", [](H2oConfig& c) { c.head_floor_share = -0.1; });
    bad("observation_window", [](H2oConfig& c) { c.observation_window = 0; });
    bad("ema_alpha", [](H2oConfig& c) { c.ema_alpha = 1.0; });
    bad("ema_alpha", [](H2oConfig& c) { c.ema_alpha = -0.1; });
    bad("layer_start", [](H2oConfig& c) { c.layer_start = 30; });
    bad("layer_start", [](H2oConfig& c) { c.layer_start = 1025; }, 2000);  // the schema's bound
    bad("layer_start", [](H2oConfig& c) { c.layer_start = -1; });
    bad("layer_end", [](H2oConfig& c) {
        c.layer_start = 2;
        c.layer_end = 2;
    });
    bad("layer_end", [](H2oConfig& c) { c.layer_end = 31; });
    bad("trigger_min_tokens", [](H2oConfig& c) { c.trigger_min_tokens = -5; });
    bad("update_interval", [](H2oConfig& c) { c.update_interval = 0; });
    CHECK(resolved(H2oConfig{}, 30).layer_end == 30, "layer_end -1 resolves to n_layers");
    // The defaults are the schema's (config_schema.h, generated from mnn_h2o/config.py).
    const H2oConfig d;
    CHECK(d.policy == schema::h2o::policy::kDefault && d.target_lossy_ratio == schema::h2o::target_lossy_ratio::kDefault &&
              d.layer_start == schema::h2o::layer_start::kDefault && d.sink_tokens == schema::h2o::sink_tokens::kDefault &&
              d.trigger_min_tokens == schema::h2o::trigger_min_tokens::kDefault &&
              d.layer_budget == schema::h2o::layer_budget::kDefault,
          "H2oConfig defaults are the schema's");

    KvCache cache(small_config(3, 64));
    H2oConfig c;
    c.layer_start = 3;  // only 3 layers
    CHECK(throws<std::invalid_argument>([&] { cache.enable_h2o(c); }), "enable_h2o validates");
    CHECK(cache.h2o_config() == nullptr, "a failed enable leaves eviction off");
}

static void test_plan_validation() {
    using Runs = std::vector<TokenRun>;
    const auto err = [](const Runs& r, int len = 100, int sink = 8, int recent = 10) {
        return plan_error(r, len, sink, recent);
    };
    CHECK(err({{0, 100}}).empty(), "keep all");
    CHECK(err({{0, 8}, {50, 5}, {90, 10}}).empty(), "floors and a middle run");
    CHECK(err({{0, 4}, {4, 4}, {60, 30}, {90, 10}}).empty(), "touching runs cover floors together");
    CHECK(!err({}).empty(), "empty plan");
    CHECK(!err({{0, 8}, {20, 0}, {90, 10}}).empty(), "empty run");
    CHECK(!err({{-1, 9}, {90, 10}}).empty(), "negative offset");
    CHECK(!err({{0, 8}, {90, 11}}).empty(), "past the end");
    CHECK(!err({{0, 8}, {100, 1}}).empty(), "offset at length");
    CHECK(!err({{0, 8}, {5, 10}, {90, 10}}).empty(), "overlap");
    CHECK(!err({{0, 8}, {90, 10}, {50, 5}}).empty(), "unsorted");
    CHECK(!err({{0, 8}, {89, 10}}).empty(), "last token dropped");
    CHECK(!err({{0, 7}, {90, 10}}).empty(), "sink floor");
    CHECK(!err({{1, 8}, {90, 10}}).empty(), "sink floor must start at 0");
    CHECK(!err({{0, 8}, {91, 9}}).empty(), "recent floor");
    CHECK(err({{0, 3}}, 3).empty(), "floors larger than the head: everything");
    CHECK(err({{99, 1}}, 100, 0, 1).empty(), "no floors: only the last token");
    CHECK(!err({{0, 1}}, 0, 0, 1).empty(), "empty head");
    CHECK(err({{0, 8}, {90, 10}}).find("run") == std::string::npos, "valid plan has no message");
    CHECK(err({{0, 8}, {5, 10}, {90, 10}}).rfind("run 1", 0) == 0, "message names the run: %s",
          err({{0, 8}, {5, 10}, {90, 10}}).c_str());

    std::vector<uint8_t> keep{1, 0, 1, 1, 0, 1};
    std::vector<TokenRun> runs;
    plan_from_blocks(keep, 90, 16, &runs);
    CHECK(runs.size() == 3 && runs[0].offset == 0 && runs[0].length == 16 && runs[1].offset == 32 &&
              runs[1].length == 32 && runs[2].offset == 80 && runs[2].length == 10,
          "plan_from_blocks merges adjacent blocks and clips the last");
}

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
    auto h2o = make_policy("h2o", 0);
    CHECK(select(*h2o, 3) == "1010100111", "h2o keeps the top scores: %s", kept().c_str());
    CHECK(select(*h2o, 0) == "1000000011", "h2o with no extra budget keeps the floors: %s", kept().c_str());
    CHECK(select(*h2o, 99) == "1111111111", "h2o with a budget past the candidates keeps all: %s", kept().c_str());
    CHECK(select(*h2o, 6) == "1111101111", "NaN ranks lowest: %s", kept().c_str());
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
    H2oConfig c;
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
    cache.enable_h2o(c);
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
    CHECK(policy_list().size() == 9 && policy_list()[0] == "h2o", "registry of 9, h2o first");
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

static void test_budgets() {
    KvCacheConfig cc = small_config(30, 4096);
    H2oConfig c;  // adaptive, lossy 3, layers [2, 30)
    c.target_lossy_ratio = 3.0;
    c.layer_start = 2;
    H2oState s(c, cc);
    const double k = (30.0 / 3.0 - 2.0) / 28.0;
    CHECK(std::fabs(s.keep_ratio() - k) < 1e-12, "adaptive keep ratio %f, want %f", s.keep_ratio(), k);
    CHECK(s.budget_blocks(2048) == static_cast<int>(std::ceil(k * 2048 / 16)), "budget %d", s.budget_blocks(2048));
    CHECK(H2oState(keep_config(1.0), cc).budget_blocks(1001) == 63, "keep ratio 1 keeps a partial last block");
    c.layer_start = 0;
    CHECK(std::fabs(H2oState(c, cc).keep_ratio() - 1.0 / 3.0) < 1e-12, "all layers evicting: 1/R");
    c.layer_start = 20;  // 10 evicting layers cannot reach 3x: 20 layers already hold 2/3 of 1/3
    CHECK(H2oState(c, cc).keep_ratio() <= 0.0, "unreachable target gives k <= 0");
    c = keep_config(0.25);
    CHECK(H2oState(c, cc).keep_ratio() == 0.25 && H2oState(c, cc).budget_blocks(1000) == 16, "static budget");

    // Skip reasons are counted per head and update.
    KvCache cache(small_config(3, 1024));
    std::mt19937 rng(1);
    H2oConfig u;
    u.layer_start = 1;
    u.target_lossy_ratio = 10.0;  // 3 layers, 2 evicting: k = (0.3 - 1) / 2 < 0
    u.sink_tokens = 16;
    u.recent_tokens = 32;
    u.trigger_min_tokens = 100;
    cache.enable_h2o(u);
    for (int layer = 0; layer < 3; ++layer) step(cache, layer, 200, rng);
    CHECK(!cache.end_step(200, true), "unreachable target: nothing evicted");
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    H2oStats st = cache.h2o_stats();
    CHECK(st.layers[1].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)] == 2,
          "target_unreachable counted per head: %lld",
          static_cast<long long>(st.layers[1].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)]));
    CHECK(st.layers[0].counters.skipped[static_cast<int>(SkipReason::TargetUnreachable)] == 0, "layer 0 not evicting");
    CHECK(st.updates == 1, "one decode update, got %lld", static_cast<long long>(st.updates));

    u.target_lossy_ratio = 0.0;
    u.target_keep_ratio = 0.1;  // at 264 tokens: 26.4 tokens -> 2 blocks < 1 sink + 3 recent floor blocks
    u.max_floor_share = 0.0;    // the old rule: such a head is left alone
    cache.enable_h2o(u);
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    st = cache.h2o_stats();
    CHECK(st.layers[2].counters.skipped[static_cast<int>(SkipReason::FloorsExceedTarget)] == 2, "floors_exceed_target");
    CHECK(cache.length(2, 0) == 264, "nothing evicted when floors exceed the budget");

    u.trigger_min_tokens = 1000;
    cache.enable_h2o(u);
    for (int i = 0; i < 32; ++i) {
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1, rng);
        cache.end_step(1, false);
    }
    CHECK(cache.h2o_stats().layers[1].counters.skipped[static_cast<int>(SkipReason::BelowTrigger)] == 2, "below_trigger");
}

// Floors larger than the budget shrink in proportion (h2o.max_floor_share), so the target is met.
// PyramidKV budgets: decreasing linearly with depth, the same mean as the uniform keep ratio,
// flat when the last layer would fall below its floors.
static void test_pyramid_budget() {
    KvCacheConfig cc = small_config(30, 8192);
    H2oConfig c = keep_config(0.3);
    c.sink_tokens = 64;
    c.recent_tokens = 256;
    c.layer_budget = "pyramid";
    H2oState s(c, cc);
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
    CHECK(H2oState(c, cc).layer_keep_ratio(0, 4096) == 0.3, "uniform");
    c.layer_budget = "cone";
    CHECK(h2o_config_error(c, 30).rfind("layer_budget", 0) == 0, "bad layer_budget named");
}

// h2o.kv_budget_bytes: the whole model's K and V blocks stay within the cap after the prompt's cut
// and through decode updates, for f16 and for q8 (whose smaller rows fit more tokens in it).
static void test_byte_budget() {
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8}) {
        KvCacheConfig cc = small_config(4, 2048, dt);
        KvCache cache(cc);
        H2oConfig c;
        c.target_lossy_ratio = 0.0;
        c.kv_budget_bytes = 400 * 1024;
        c.layer_start = 1;
        c.sink_tokens = 16;
        c.recent_tokens = 32;
        c.trigger_min_tokens = 0;
        c.update_interval = 8;
        cache.enable_h2o(c);
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
    H2oConfig c;
    c.target_lossy_ratio = 0.0;
    c.kv_budget_bytes = 1024;
    c.trigger_min_tokens = 0;
    cache.enable_h2o(c);
    std::mt19937 rng(3);
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 300, rng);
    CHECK(!cache.end_step(300, true), "unreachable cap: no eviction");
}

static void test_floor_share() {
    // Static keep 0.1 of 1024 tokens: 7 blocks; floors 64 + 256 tokens = 4 + 16 blocks.
    const KvCacheConfig cc = small_config(3, 1024);
    H2oConfig c = keep_config(0.1, 1);
    c.sink_tokens = 64;
    c.recent_tokens = 256;
    int sink = -1, recent = -1;
    H2oState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    // cap 7 blocks: recent round(16 * 7 / 20) = 6 blocks, sink the 1 block left.
    CHECK(sink == 16 && recent == 96, "share 1: floors %d + %d tokens, want 16 + 96", sink, recent);
    H2oState(c, cc).floor_tokens(1024, 1000, &sink, &recent);  // partial last block: 6 blocks = 88 tokens
    CHECK(sink == 16 && recent == 88, "share 1, 1000 tokens: floors %d + %d, want 16 + 88", sink, recent);
    H2oState(c, cc).floor_tokens(10240, 1024, &sink, &recent);  // budget 64 blocks: floors fit
    CHECK(sink == 64 && recent == 256, "floors within the budget stay: %d + %d", sink, recent);
    c.max_floor_share = 0.5;
    c.target_keep_ratio = 0.25;  // 16 blocks, floors at most 8: recent round(16 * 8 / 20) = 6, sink 2
    H2oState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    CHECK(sink == 32 && recent == 96, "share 0.5: floors %d + %d tokens, want 32 + 96", sink, recent);
    c.max_floor_share = 0.0;
    H2oState(c, cc).floor_tokens(1024, 1024, &sink, &recent);
    CHECK(sink == 64 && recent == 256, "share 0: floors never shrink (%d + %d)", sink, recent);

    for (const double share : {1.0, 0.5, 0.0}) {
        KvCache cache(cc);
        H2oConfig u = keep_config(share == 0.5 ? 0.25 : 0.1, 1);
        u.sink_tokens = 64;
        u.recent_tokens = 256;
        u.max_floor_share = share;
        cache.enable_h2o(u);
        std::mt19937 rng(7);
        std::vector<std::vector<float>> k_before(2), v_before(2);
        for (int layer = 0; layer < 3; ++layer) step(cache, layer, 1024, rng);
        for (int h = 0; h < 2; ++h) k_before[h] = read_k(cache, 2, h, &v_before[h]);
        const bool evicted = cache.end_step(1024, true);  // valid plans, or evict() throws
        const H2oStats st = cache.h2o_stats();
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
    H2oConfig w;
    w.layer_start = 1;
    w.target_lossy_ratio = 8.0;
    w.trigger_min_tokens = 512;  // below the prompt, so it is cut
    cache.enable_h2o(w);
    std::mt19937 rng(3);
    for (int chunk = 0; chunk < 8; ++chunk) {
        for (int layer = 0; layer < 16; ++layer) step(cache, layer, 256, rng);
        cache.end_step(256, true);
    }
    const double ratio = cache.h2o_stats().lossy_ratio;
    // 16 * 2048 / (2048 + 15 * 9 * 16) = 7.79 (block rounding of the 8.53-block budget).
    CHECK(ratio > 7.7 && ratio <= 8.0, "8x with floors larger than the budget: whole-model ratio %.3f", ratio);
    // Decode: the heads now hold 144 tokens, below trigger_min_tokens (512); the trigger counts
    // the tokens the layer has seen, so they are still held to their budget.
    KvCache small(small_config(16, 2048 + 64));
    small.enable_h2o(w);
    for (int chunk = 0; chunk < 8; ++chunk) {
        for (int layer = 0; layer < 16; ++layer) step(small, layer, 256, rng);
        small.end_step(256, true);
    }
    for (int t = 0; t < 64; ++t) {
        for (int layer = 0; layer < 16; ++layer) step(small, layer, 1, rng);
        small.end_step(1, false);
    }
    const double after = small.h2o_stats().lossy_ratio;
    CHECK(after > 7.6 && after <= 8.0 && small.length(5, 0) <= 10 * 16, "after 64 decode tokens: ratio %.3f, %d held",
          after, small.length(5, 0));
}

// The EMA of normalised block scores, against a reference that collects the raw masses through
// the plain attention API and counts visibility query by query.
static void test_scores_against_reference() {
    const KvCacheConfig cc = small_config(2, 512, KvDtype::F32, 16);
    KvCache with(cc), plain(cc);
    H2oConfig c = keep_config(1.0, 1);  // keep everything: scores only
    c.ema_alpha = 0.25;
    c.update_interval = 3;
    with.enable_h2o(c);
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
        const std::vector<float> got = with.h2o_scores(1, &n);
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
    CHECK(with.h2o_stats().updates == 3, "3 updates, got %lld", static_cast<long long>(with.h2o_stats().updates));
    int n = 0;
    const std::vector<float> layer0 = with.h2o_scores(0, &n);
    CHECK(n == 0 && layer0.empty(), "layer outside the range holds nothing here");
}

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
        H2oConfig c = keep_config(1.0, 1);
        c.sink_tokens = 0;
        c.recent_tokens = 1;
        cache.enable_h2o(c);
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
        const H2oStats st = cache.h2o_stats();
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
    H2oConfig c = keep_config(1.0, 0);
    c.update_interval = 1;
    cache.enable_h2o(c);
    std::mt19937 rng(2);
    step(cache, 0, 180, rng);
    step(cache, 0, 1, rng);
    cache.end_step(1, false);  // fold: 12 blocks scored
    int n = 0;
    const std::vector<float> before = cache.h2o_scores(0, &n);
    CHECK(n == 12, "12 blocks");
    const std::vector<TokenRun> runs{{0, 16}, {48, 32}, {128, 53}};  // blocks 0, 3, 4, 8..11
    cache.evict(0, 1, runs);
    int m = 0;
    const std::vector<float> after = cache.h2o_scores(0, &m);
    CHECK(m == 12, "head 0 still holds 12 blocks");
    const int kept_blocks[] = {0, 3, 4, 8, 9, 10, 11};
    for (int j = 0; j < 7; ++j)
        CHECK(after[static_cast<size_t>(m) + j] == before[static_cast<size_t>(n) + kept_blocks[j]], "block %d -> %d score",
              kept_blocks[j], j);
    for (int j = 7; j < 12; ++j) CHECK(std::isnan(after[static_cast<size_t>(m) + j]), "head 1 holds only 7 blocks");
    for (int b = 0; b < 12; ++b) CHECK(after[b] == before[b], "head 0 scores unchanged");
    // A row-moving plan: new block 1 takes 8 tokens of old block 2 and 8 of old block 3.
    cache.evict(0, 0, {{0, 16}, {40, 141}});
    const std::vector<float> mixed = cache.h2o_scores(0, &m);
    const double want = 0.5 * before[2] + 0.5 * before[3];
    CHECK(m == 10 && mixed[0] == before[0], "unmixed block keeps its score");
    CHECK(std::fabs(mixed[1] - want) < 1e-6 * want, "mixed block score %g want %g", mixed[1], want);
}

static void test_invalid_plan_changes_nothing() {
    KvCache cache(small_config(2, 512, KvDtype::F16));
    H2oConfig c = keep_config(0.5, 1);
    cache.enable_h2o(c);
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
    const H2oStats st = cache.h2o_stats();
    CHECK(st.layers[1].counters.invalid_plans == 2 && st.layers[1].counters.evictions == 0, "invalid plans counted: %lld",
          static_cast<long long>(st.layers[1].counters.invalid_plans));
    // Without H2O only the last token is a floor.
    cache.disable_h2o();
    cache.evict(1, 0, {{99, 1}});
    CHECK(cache.length(1, 0) == 1, "eviction off: explicit plans still apply");
    CHECK(throws<std::invalid_argument>([&] { cache.h2o_scores(1, nullptr); }), "scores need H2O on");
}

// end_step counts decode tokens, the same for every layer: an update every update_interval
// tokens evicts on every evicting layer; after prefill only when the prompt exceeds the budget.
static void test_schedule() {
    KvCache cache(small_config(4, 2048, KvDtype::F16));
    H2oConfig c = keep_config(0.5, 1);
    c.update_interval = 8;
    c.trigger_min_tokens = 64;
    cache.enable_h2o(c);
    std::mt19937 rng(6);
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 40, rng);
    CHECK(!cache.end_step(40, true) && cache.h2o_stats().updates == 0, "short prompt: below trigger, no update");
    for (int layer = 0; layer < 4; ++layer) step(cache, layer, 360, rng);
    const std::vector<float> prompt_k = read_k(cache, 2, 1);
    CHECK(cache.end_step(360, true), "prompt over budget: evicted after prefill");
    // The floors survive: the first 16 tokens (sink) and the last 32 (recent), row for row.
    const std::vector<float> kept_k = read_k(cache, 2, 1);
    CHECK(std::equal(prompt_k.begin(), prompt_k.begin() + 16 * 32, kept_k.begin()), "sink rows kept");
    CHECK(std::equal(prompt_k.end() - 32 * 32, prompt_k.end(), kept_k.end() - 32 * 32), "recent rows kept");
    H2oStats st = cache.h2o_stats();
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
        CHECK(cache.h2o_stats().updates == 1 + t / 8, "updates after %d tokens: %lld", t,
              static_cast<long long>(cache.h2o_stats().updates));
    }
    // Held grows by 8 tokens and the budget by 4 per update: a block goes about every 32 tokens.
    CHECK(evicting_calls == 2, "evicting updates: %d", evicting_calls);
    st = cache.h2o_stats();
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
    st = cache.h2o_stats();
    CHECK(st.bytes_held == 0 && st.updates == 0 && st.layers[1].counters.evictions == 0 && st.lossy_ratio == 1.0,
          "reset clears the counters");
    CHECK(cache.h2o_config() != nullptr, "reset keeps H2O on");
}

// Eviction off, or a layer outside the range: outputs bit-identical to a cache that never had it.
static void test_off_is_unchanged() {
    const KvCacheConfig cc = small_config(3, 1024, KvDtype::F16);
    KvCache never(cc), toggled(cc), other_layers(cc);
    toggled.enable_h2o(keep_config(0.25, 0));
    toggled.disable_h2o();
    H2oConfig c = keep_config(0.25, 1);
    c.layer_end = 2;
    other_layers.enable_h2o(c);
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

// Evicting most of a long cache gives the memory back: bytes_held exactly, RSS about as much.
static void test_memory_released() {
    KvCacheConfig cc;
    cc.n_layers = 30;
    cc.n_kv_heads = 3;
    cc.head_dim = 64;
    cc.n_heads = 9;
    cc.dtype = KvDtype::F16;
    cc.block_tokens = 64;
    cc.max_tokens = 4096;
    cc.threads = 1;
    KvCache cache(cc);
    H2oConfig c;  // adaptive 3x over the whole model, layers [2, 30)
    c.target_lossy_ratio = 3.0;
    c.layer_start = 2;
    cache.enable_h2o(c);
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
    const H2oStats st = cache.h2o_stats();
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

// Policy time of one update at the target's shape: 28 evicting layers x 3 kv heads x 128 blocks.
static void test_policy_time() {
    KvCacheConfig cc;
    cc.n_layers = 30;
    cc.n_kv_heads = 3;
    cc.head_dim = 64;
    cc.n_heads = 9;
    cc.dtype = KvDtype::F16;
    cc.block_tokens = 64;
    cc.max_tokens = 8192;
    cc.threads = 1;
    std::mt19937 rng(12);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (bool shared : {false, true}) {
        H2oConfig c;
        c.per_head_budget = shared;
        c.target_lossy_ratio = 3.0;
        c.layer_start = 2;
        H2oState s(c, cc);
        H2oLayerStats st;
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
    test_config_validation();
    test_plan_validation();
    test_policies();
    test_policy_signals();
    test_policy_scores();
    test_shared_budget_selection();
    test_budgets();
    test_floor_share();
    test_pyramid_budget();
    test_byte_budget();
    test_scores_against_reference();
    for (KvDtype dt : {KvDtype::F32, KvDtype::F16}) test_compaction(dt);
    test_scores_follow_compaction();
    test_invalid_plan_changes_nothing();
    test_schedule();
    test_off_is_unchanged();
    test_memory_released();
    test_policy_time();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all h2o tests passed\n");
    return 0;
}
