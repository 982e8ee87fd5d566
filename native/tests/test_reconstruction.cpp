// Context reconstruction (KVzip, docs/eviction.md "Reconstruction") and the global budget:
// - the attention kernels' block peaks (block_max) of every available ISA, tiled and decoded, with
//   and without threads, against a float64 reference and the scalar kernels, the block masses
//   unchanged beside them, the max taken with what the accumulator held;
// - a pass through KvCache leaves the cache as it was (lengths, bytes, rows, tokens_seen, the H2O
//   scores) and gives the kvzip policy the block the reconstruction queries looked at;
// - layer_budget "global": heads of all evicting layers share one budget (a concentrated head
//   gives blocks to a spread one), with the same total as uniform.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/cache/kv_dtype.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/runtime/thread_pool.h"

#include "test_support.h"

using namespace mnn_h2o;

static std::vector<Isa> available_isas() {
    std::vector<Isa> isas;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
        if (isa_available(isa)) isas.push_back(isa);
    return isas;
}

static double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        e = std::max(e, std::fabs(a[i] - b[i]));
        m = std::max(m, std::fabs(b[i]));
    }
    return e / m;
}

// The peaks of every ISA against float64: for each kv head and block, the largest probability
// any query (any query head of the group) gave a key of the block, maxed with a prior value.
static void test_block_max() {
    std::mt19937 rng(5);
    ThreadPool pool(2);
    const int G = 3, hd = 64, n_keys = 300;
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8}) {
        KvCacheConfig cfg;
        cfg.n_layers = 1;
        cfg.n_kv_heads = 2;
        cfg.head_dim = hd;
        cfg.n_heads = 2 * G;
        cfg.dtype = dt;
        cfg.block_tokens = 16;
        cfg.max_tokens = 512;
        cfg.threads = 1;
        KvCache cache(cfg);
        const int mb = cache.max_blocks();
        auto k = random_vec(rng, static_cast<size_t>(n_keys) * 2 * hd), v = random_vec(rng, k.size());
        cache.append(0, k.data(), v.data(), n_keys);
        std::vector<float> kh[2], vh[2];
        for (int h = 0; h < 2; ++h) {
            kh[h].resize(static_cast<size_t>(n_keys) * hd);
            vh[h].resize(kh[h].size());
            cache.read(0, h, kh[h].data(), vh[h].data());
        }
        KvHeadView views[2] = {cache.view(0, 0), cache.view(0, 1)};
        // 1 and 2 queries take the decode path, 37 and 130 the tiles (on every ISA).
        for (int n_q : {1, 2, 37, 130}) {
            auto q = random_vec(rng, static_cast<size_t>(n_q) * 2 * G * hd, 3.f);
            const std::vector<float> seen = queries_seen(dt, q, n_q, hd);
            // A prior peak on block 1 above anything softmax gives there, and one below.
            std::vector<double> ref(2 * static_cast<size_t>(mb), 0.0);
            ref[1] = 2.0;
            ref[mb + 1] = 1e-9;
            for (int h = 0; h < 2; ++h)
                for (int t = 0; t < n_q; ++t)
                    for (int g = 0; g < G; ++g) {
                        const float* qr = &seen[(static_cast<size_t>(t) * 2 * G + h * G + g) * hd];
                        const int visible = n_keys - n_q + t + 1;
                        std::vector<double> sc(visible);
                        double m = -INFINITY, l = 0;
                        for (int j = 0; j < visible; ++j) {
                            double dot = 0;
                            for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * kh[h][j * hd + d];
                            m = std::max(m, sc[j] = dot / 8.0);
                        }
                        for (double& x : sc) l += (x = std::exp(x - m));
                        for (int j = 0; j < visible; ++j) {
                            double& r = ref[h * mb + j / 16];
                            r = std::max(r, sc[j] / l);
                        }
                    }
            std::vector<float> scalar_max;
            for (Isa isa : available_isas()) {
                for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
                    AttentionProblem p;
                    p.n_kv_heads = 2;
                    p.group = G;
                    p.head_dim = hd;
                    p.block_tokens = 16;
                    p.dtype = dt;
                    p.heads = views;
                    p.q = q.data();
                    p.n_q = n_q;
                    std::vector<float> out(q.size()), plain(2 * static_cast<size_t>(mb), 0.f), scores(plain), peak(plain);
                    peak[1] = 2.f;
                    peak[mb + 1] = 1e-9f;
                    p.out = out.data();
                    p.block_scores = plain.data();
                    p.scores_stride = mb;
                    AttentionWorkspace ws;
                    attention(p, isa, tp, ws);
                    p.block_scores = scores.data();
                    p.block_max = peak.data();
                    attention(p, isa, tp, ws);
                    const std::string what = std::string(isa_name(isa)) + " " + kv_dtype_name(dt) +
                                             " n_q=" + std::to_string(n_q) + (tp ? " threads" : "");
                    CHECK(std::memcmp(plain.data(), scores.data(), plain.size() * sizeof(float)) == 0,
                          "%s: block scores change with block_max", what.c_str());
                    const double e = max_rel(peak, ref);
                    CHECK(e < 2e-5, "%s: peak rel err %.3g vs float64", what.c_str(), e);
                    CHECK(peak[1] == 2.f, "%s: a larger prior peak stays", what.c_str());
                    if (isa == Isa::Scalar && !tp) {
                        scalar_max = peak;
                    } else {
                        double d = 0;
                        for (size_t i = 0; i < peak.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(peak[i]) - scalar_max[i]));
                        CHECK(d < 1e-5, "%s: peaks differ from scalar by %.3g", what.c_str(), d);
                    }
                }
            }
        }
    }
    AttentionProblem p;  // peaks without block scores are malformed
    AttentionWorkspace ws;
    KvHeadView view;
    const void* blocks[1] = {nullptr};
    view.k_blocks = view.v_blocks = blocks;
    view.n_keys = 1;
    std::vector<float> q(16), out(16), peak(1);
    p.n_kv_heads = p.group = p.n_q = 1;
    p.head_dim = p.block_tokens = 16;
    p.heads = &view;
    p.q = q.data();
    p.out = out.data();
    p.block_max = peak.data();
    p.scores_stride = 1;
    CHECK(throws<std::invalid_argument>([&] { attention(p, Isa::Scalar, nullptr, ws); }), "block_max needs block scores");
}

static KvCacheConfig cache_config(int n_layers, int n_kv_heads, int max_tokens) {
    KvCacheConfig c;
    c.n_layers = n_layers;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = 32;
    c.n_heads = 2 * n_kv_heads;
    c.dtype = KvDtype::F32;
    c.block_tokens = 16;
    c.max_tokens = max_tokens;
    c.threads = 1;
    return c;
}

static EvictionConfig kvzip_config(double keep) {
    EvictionConfig h;
    h.policy = "kvzip";
    h.layer_budget = "uniform";  // per-head budgets the checks count; global has its own test
    h.target_keep_ratio = keep;
    h.sink_tokens = 16;
    h.recent_tokens = 16;
    h.trigger_min_tokens = 0;
    h.update_interval = 1;
    return h;
}

// Steps n tokens of keys k / values v (rows [n][n_kv_heads][hd]) with queries q through every layer.
static void step_all(KvCache& cache, const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, int n) {
    const KvCacheConfig& c = cache.config();
    std::vector<float> out(static_cast<size_t>(n) * c.n_heads * c.head_dim);
    for (int layer = 0; layer < c.n_layers; ++layer) cache.step(layer, q.data(), k.data(), v.data(), n, out.data());
}

// A pass leaves the cache as it was; its queries decide what kvzip keeps.
static void test_pass() {
    std::mt19937 rng(9);
    const int L = 2, H = 2, hd = 32, n = 160, n_rep = 40;  // 10 blocks of context
    const KvCacheConfig cc = cache_config(L, H, 512);
    KvCache cache(cc), twin(cc);
    // keep 0.6: 6 of 10 blocks per head (sink 1 + recent 1 + 4 chosen); every layer evicts.
    cache.enable_eviction(kvzip_config(0.6));
    EvictionConfig ema = kvzip_config(1.0);  // a twin that evicts nothing and gets no pass: the EMA reference
    twin.enable_eviction(ema);
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
    const auto q = random_vec(rng, static_cast<size_t>(n) * 2 * H * hd);
    step_all(cache, q, k, v, n);
    step_all(twin, q, k, v, n);
    const size_t bytes = cache.bytes_held();
    const int64_t seen = cache.eviction_stats().layers[0].counters.tokens_seen;

    CHECK(throws<std::invalid_argument>([&] { twin.rewind_reconstruction(); }), "rewind without a pass");
    cache.begin_reconstruction();
    CHECK(throws<std::invalid_argument>([&] { cache.begin_reconstruction(); }), "one pass at a time");
    // The reconstruction queries look at block 4 (tokens 64..79) of every head: their query is a
    // large multiple of the mean key of that block, in both query heads of the group.
    std::vector<float> rq(static_cast<size_t>(n_rep) * 2 * H * hd), rk = random_vec(rng, static_cast<size_t>(n_rep) * H * hd);
    for (int t = 0; t < n_rep; ++t)
        for (int qh = 0; qh < 2 * H; ++qh)
            for (int d = 0; d < hd; ++d) {
                float mean = 0;
                for (int j = 64; j < 80; ++j) mean += k[(static_cast<size_t>(j) * H + qh / 2) * hd + d];
                rq[(static_cast<size_t>(t) * 2 * H + qh) * hd + d] = mean;
            }
    step_all(cache, rq, rk, rk, 25);  // two chunks of one pass, each dropped after
    CHECK(cache.length(0, 0) == n + 25 && cache.bytes_held() > bytes, "the pass's tokens are held while it runs");
    CHECK(throws<std::invalid_argument>([&] { cache.end_step(25, true); }), "no end_step during a pass");
    cache.rewind_reconstruction();
    CHECK(cache.length(1, 1) == n && cache.bytes_held() == bytes, "rewound");
    step_all(cache, rq, rk, rk, n_rep);
    cache.end_reconstruction();
    CHECK(!cache.reconstructing(), "pass over");
    for (int layer = 0; layer < L; ++layer)
        for (int h = 0; h < H; ++h) {
            CHECK(cache.length(layer, h) == n, "layer %d head %d holds the context only", layer, h);
            std::vector<float> k1(static_cast<size_t>(n) * hd), v1(k1.size()), k2(k1.size()), v2(k1.size());
            cache.read(layer, h, k1.data(), v1.data());
            twin.read(layer, h, k2.data(), v2.data());
            CHECK(k1 == k2 && v1 == v2, "layer %d head %d: rows unchanged by the pass", layer, h);
        }
    CHECK(cache.bytes_held() == bytes && cache.eviction_stats().layers[1].counters.tokens_seen == seen,
          "bytes and tokens_seen as before the pass");
    int nb = 0;
    const std::vector<float> rs = cache.eviction_scores(1, &nb, true);
    CHECK(nb == 10, "10 blocks scored");
    for (int h = 0; h < H; ++h) {
        const float* row = rs.data() + static_cast<size_t>(h) * nb;
        CHECK(std::max_element(row, row + nb) - row == 4, "head %d: block 4 has the largest peak", h);
        CHECK(std::all_of(row, row + nb, [](float x) { return x > 0.f && x <= 1.f; }), "peaks are probabilities");
    }

    // The eviction: kvzip keeps block 4 with the floors; then the H2O scores, folded at the same
    // update in both caches, are the twin's (the pass added nothing to them).
    std::vector<float> one_q(static_cast<size_t>(2 * H * hd)), one_k(static_cast<size_t>(H * hd));
    CHECK(cache.end_step(n, true), "the prompt is cut after the pass");
    for (int layer = 0; layer < L; ++layer)
        for (int h = 0; h < H; ++h) {
            CHECK(cache.length(layer, h) == 96, "layer %d head %d keeps 6 blocks (%d tokens)", layer, h, cache.length(layer, h));
            std::vector<float> k1(96 * hd), v1(k1.size());
            cache.read(layer, h, k1.data(), v1.data());
            bool kept = false;  // the first row of block 4 is among the kept rows
            const float* want = &k[(static_cast<size_t>(64) * H + h) * hd];
            for (int r = 0; r < 96; ++r) kept = kept || std::memcmp(&k1[static_cast<size_t>(r) * hd], want, hd * sizeof(float)) == 0;
            CHECK(kept, "layer %d head %d kept block 4", layer, h);
        }
    KvCache plain(cc), plain_twin(cc);  // the EMA: a pass (nothing evicted) changes no H2O score
    plain.enable_eviction(ema);
    plain_twin.enable_eviction(ema);
    step_all(plain, q, k, v, n);
    step_all(plain_twin, q, k, v, n);
    plain.begin_reconstruction();
    step_all(plain, rq, rk, rk, n_rep);
    plain.end_reconstruction();
    step_all(plain, one_q, one_k, one_k, 1);
    step_all(plain_twin, one_q, one_k, one_k, 1);
    plain.end_step(1, false);  // update_interval 1: an update, nothing evicted (keep 1)
    plain_twin.end_step(1, false);
    for (int layer = 0; layer < L; ++layer) {
        int n1 = 0, n2 = 0;
        const std::vector<float> a = plain.eviction_scores(layer, &n1), b = plain_twin.eviction_scores(layer, &n2);
        CHECK(n1 == n2 && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
              "layer %d: the EMA does not see the pass", layer);
    }
    KvCache no_policy(cc);
    EvictionConfig eviction = kvzip_config(0.5);
    eviction.policy = "h2o";
    no_policy.enable_eviction(eviction);
    CHECK(!no_policy.eviction_reconstructs() && throws<std::invalid_argument>([&] { no_policy.begin_reconstruction(); }),
          "only a reconstructing policy takes a pass");
}

// set_reconstruction_window (KVzip's chunk scoring): each chunk's queries share their probability
// among the first kReconstructionSinks rows, the chunk and the pass's own rows (causal); only the
// chunk's tokens get a peak, and a block's reconstruction score is the largest of its tokens'.
// Q8 as well: the window starts inside a block, so its rows are read from the middle of one.
static void test_window_pass(KvDtype dtype) {
    std::mt19937 rng(21);
    const int H = 2, G = 2, hd = 32, n = 160, n_rep = 30;
    KvCacheConfig cc = cache_config(1, H, 512);
    cc.dtype = dtype;
    KvCache cache(cc);
    cache.enable_eviction(kvzip_config(0.6));
    const auto v = random_vec(rng, static_cast<size_t>(n) * H * hd);
    step_all(cache, random_vec(rng, static_cast<size_t>(n) * G * H * hd), random_vec(rng, v.size()), v, n);
    // The keys as stored (the reference's), rows [n][H][hd] like the ones stepped.
    std::vector<float> k(v.size()), kh(static_cast<size_t>(n) * hd), vh(kh.size());
    for (int h = 0; h < H; ++h) {
        cache.read(0, h, kh.data(), vh.data());
        for (int j = 0; j < n; ++j)
            std::copy(&kh[static_cast<size_t>(j) * hd], &kh[static_cast<size_t>(j + 1) * hd], &k[(static_cast<size_t>(j) * H + h) * hd]);
    }
    CHECK(throws<std::invalid_argument>([&] { cache.set_reconstruction_window(10, 10); }), "a window needs a pass");
    // Two chunks: rows [60, 124), then [124, 160) (from the end: 100 and 36).
    const int chunks[2][2] = {{100, 64}, {36, 36}};
    std::vector<double> ref(static_cast<size_t>(H) * n, 0.0);
    cache.begin_reconstruction();
    CHECK(throws<std::invalid_argument>([&] { cache.set_reconstruction_window(-1, 4); }), "negative from_end");
    for (const auto& c : chunks) {
        const int begin = n - c[0], end = begin + c[1];
        cache.set_reconstruction_window(c[0], c[1]);
        const auto rq = random_vec(rng, static_cast<size_t>(n_rep) * G * H * hd, 2.f);
        const std::vector<float> rq_seen = queries_seen(dtype, rq, n_rep, hd);
        auto rk = random_vec(rng, static_cast<size_t>(n_rep) * H * hd);
        // The pass's keys as stored, too (a round trip is exact for F32).
        std::vector<uint8_t> stored(kv_row_bytes(dtype, hd) * n_rep * H);
        kv_rows_from_f32(dtype, rk.data(), stored.data(), static_cast<size_t>(n_rep) * H, hd);
        kv_rows_to_f32(dtype, stored.data(), rk.data(), static_cast<size_t>(n_rep) * H, hd);
        step_all(cache, rq, rk, rk, n_rep);
        cache.rewind_reconstruction();
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < n_rep; ++t)
                for (int g = 0; g < G; ++g) {
                    const float* qr = &rq_seen[(static_cast<size_t>(t) * H * G + h * G + g) * hd];
                    std::vector<std::pair<int, double>> sc;  // (context row or -1, score)
                    const auto dot = [&](const float* kr) {
                        double d = 0;
                        for (int x = 0; x < hd; ++x) d += static_cast<double>(qr[x]) * kr[x];
                        return d / std::sqrt(static_cast<double>(hd));
                    };
                    for (int j = 0; j < std::min(KvCache::kReconstructionSinks, begin); ++j)
                        sc.push_back({-1, dot(&k[(static_cast<size_t>(j) * H + h) * hd])});
                    for (int j = begin; j < end; ++j) sc.push_back({j, dot(&k[(static_cast<size_t>(j) * H + h) * hd])});
                    for (int j = 0; j <= t; ++j) sc.push_back({-1, dot(&rk[(static_cast<size_t>(j) * H + h) * hd])});
                    double m = -INFINITY, l = 0;
                    for (const auto& e : sc) m = std::max(m, e.second);
                    for (const auto& e : sc) l += std::exp(e.second - m);
                    for (const auto& e : sc)
                        if (e.first >= 0) {
                            double& r = ref[static_cast<size_t>(h) * n + e.first];
                            r = std::max(r, std::exp(e.second - m) / l);
                        }
                }
    }
    cache.end_reconstruction();
    const EvictionState& st = *cache.eviction_state();
    for (int h = 0; h < H; ++h) {
        double e = 0, mx = 0;
        for (int t = 0; t < n; ++t) {
            const double want = ref[static_cast<size_t>(h) * n + t];
            e = std::max(e, std::fabs(st.token_score(0, h, t) - want));
            mx = std::max(mx, want);
        }
        CHECK(mx > 0 && e < 2e-5 * mx, "head %d: windowed token peaks off by %.3g (largest %.3g)", h, e, mx);
        for (int t = 0; t < 60; ++t) CHECK(st.token_score(0, h, t) == 0.f, "head %d token %d: outside every chunk", h, t);
        for (int b = 0; b < n / 16; ++b) {
            float want = 0.f;
            for (int t = b * 16; t < (b + 1) * 16; ++t) want = std::max(want, st.token_score(0, h, t));
            CHECK(st.reconstruction_score(0, h, b) == want, "head %d block %d: the largest of its tokens' peaks", h, b);
        }
    }
}

// layer_budget "global": a head whose scores are all high keeps every block, paid for by the
// others; the total is the uniform total.
static void test_global_budget() {
    const int L = 3, H = 2, n = 256;  // 16 blocks per head
    const KvCacheConfig cc = cache_config(L, H, 512);
    EvictionConfig c;
    c.policy = "h2o";
    c.target_keep_ratio = 0.5;  // 8 blocks per head, 48 in all
    c.sink_tokens = 0;
    c.recent_tokens = 1;
    c.trigger_min_tokens = 0;
    c.layer_start = 1;          // layer 0 keeps everything and is no part of the pool
    c.layer_budget = "global";
    EvictionState s(c, cc);
    std::vector<int> lengths(static_cast<size_t>(2 * H), n);
    std::vector<int64_t> seen(2, n);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> low(0.001f, 0.01f);
    for (int layer = 1; layer < L; ++layer) {
        float* acc = s.accumulator(layer);
        for (int h = 0; h < H; ++h) {
            for (int b = 0; b < 16; ++b) acc[h * s.stride() + b] = layer == 2 && h == 1 ? 0.5f : low(rng);
            s.record_step(layer, h, n, 1);
        }
        s.update_scores(layer, lengths.data() + (layer - 1) * H);
    }
    std::vector<EvictionLayerStats> stats(L);
    std::vector<std::vector<TokenRun>> plans;
    CHECK(s.over_budget_global(seen.data(), lengths.data()), "64 blocks over a budget of 32");
    s.plan_global(seen.data(), lengths.data(), &plans, stats.data());
    CHECK(plans.size() == static_cast<size_t>(2 * H), "a plan slot per evicting (layer, head)");
    int total = 0;
    for (size_t i = 0; i < plans.size(); ++i) {
        int kept = 0;
        for (const TokenRun& r : plans[i]) kept += static_cast<int>(r.length);
        if (plans[i].empty()) kept = n;
        total += kept;
        if (i == 3) CHECK(kept == n, "the concentrated head keeps all of its 16 blocks (%d tokens)", kept);
        else CHECK(kept < 8 * 16, "head %zu gives blocks to it (%d tokens)", i, kept);
    }
    CHECK(total == 32 * 16, "global total = uniform total (%d tokens)", total);

    // Through the cache: a global budget holds exactly the bytes of the uniform one.
    std::mt19937 r2(4);
    const auto k = random_vec(r2, static_cast<size_t>(n) * H * 32), v = random_vec(r2, k.size());
    const auto q = random_vec(r2, static_cast<size_t>(n) * 2 * H * 32, 2.f);
    size_t held[2];
    for (int g = 0; g < 2; ++g) {
        KvCache cache(cc);
        EvictionConfig u = c;
        u.sink_tokens = 16;
        u.recent_tokens = 32;
        u.layer_budget = g ? "global" : "uniform";
        cache.enable_eviction(u);
        step_all(cache, q, k, v, n);
        CHECK(cache.end_step(n, true), "%s evicts", u.layer_budget.c_str());
        held[g] = cache.bytes_held();
    }
    CHECK(held[0] == held[1], "uniform %zu bytes, global %zu", held[0], held[1]);
    EvictionConfig too_many = c;  // more (layer, head) pairs than one selection ranks
    CHECK(throws<std::invalid_argument>([&] { EvictionState(too_many, cache_config(3, 4096, 64)); }),
          "global budget: at most 4096 pairs");
}

// predicted_kvzip: the engine gives each token's score as it enters (set_token_scores), no pass;
// the scores are kept per token until the next update, which ranks tokens by them as it ranks a
// pass's peaks (the floors, then the highest scores), and each block's score is its tokens' max.
static void test_predicted_scores() {
    std::mt19937 rng(33);
    const int L = 2, H = 2, hd = 32, n = 160;
    const KvCacheConfig cc = cache_config(L, H, 512);
    KvCache cache(cc);
    EvictionConfig h = kvzip_config(0.5);  // 5 of 10 blocks' tokens: 80
    h.policy = "predicted_kvzip";
    h.layer_start = 1;  // layer 0 keeps everything and takes no scores
    cache.enable_eviction(h);
    CHECK(cache.eviction_predicts() && !cache.eviction_reconstructs(), "predicted: scores given, no pass");
    CHECK(throws<std::invalid_argument>([&] { cache.begin_reconstruction(); }), "no pass for predicted scores");
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
    const auto q = random_vec(rng, static_cast<size_t>(n) * 2 * H * hd);
    // Token t of head hh scores 0.01 + 1e-4 t, except 24 tokens per head at 0.5 + 0.01 t / n.
    auto score = [](int hh, int t) {
        const bool high = hh == 0 ? (t >= 40 && t < 64) : (t >= 100 && t < 124);
        return high ? 0.5f + 0.01f * t / 160 : 0.01f + 1e-4f * t;
    };
    const int chunks[2][2] = {{0, 96}, {96, 64}};  // (first token, tokens)
    for (const auto& c : chunks) {
        std::vector<float> qc(q.begin() + static_cast<size_t>(c[0]) * 2 * H * hd, q.begin() + static_cast<size_t>(c[0] + c[1]) * 2 * H * hd);
        std::vector<float> kc(k.begin() + static_cast<size_t>(c[0]) * H * hd, k.begin() + static_cast<size_t>(c[0] + c[1]) * H * hd);
        std::vector<float> vc(v.begin() + static_cast<size_t>(c[0]) * H * hd, v.begin() + static_cast<size_t>(c[0] + c[1]) * H * hd);
        step_all(cache, qc, kc, vc, c[1]);
        std::vector<float> s(static_cast<size_t>(H) * c[1]);
        for (int hh = 0; hh < H; ++hh)
            for (int i = 0; i < c[1]; ++i) s[static_cast<size_t>(hh) * c[1] + i] = score(hh, c[0] + i);
        cache.set_token_scores(1, s.data(), c[1]);
        CHECK(throws<std::invalid_argument>([&] { cache.set_token_scores(0, s.data(), c[1]); }),
              "layer 0 does not evict: no scores");
    }
    std::vector<float> bad(static_cast<size_t>(H) * (n + 1), 0.1f);
    CHECK(throws<std::invalid_argument>([&] { cache.set_token_scores(1, bad.data(), n + 1); }), "more tokens than held");
    bad[3] = 1.5f;
    CHECK(throws<std::invalid_argument>([&] { cache.set_token_scores(1, bad.data(), 4); }), "a score above 1");
    bad[3] = std::numeric_limits<float>::quiet_NaN();
    CHECK(throws<std::invalid_argument>([&] { cache.set_token_scores(1, bad.data(), 4); }), "a NaN score");
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(1, hh);
        bool same = ts.size() == static_cast<size_t>(n);
        for (int t = 0; same && t < n; ++t) same = ts[t] == score(hh, t);
        CHECK(same, "head %d: the token scores are those given (the rejected calls changed nothing)", hh);
        for (int b = 0; b < 10; ++b) {
            float want = 0;
            for (int t = b * 16; t < b * 16 + 16; ++t) want = std::max(want, score(hh, t));
            CHECK(cache.eviction_state()->reconstruction_score(1, hh, b) == want, "head %d block %d: its tokens' max", hh, b);
        }
    }
    CHECK(cache.end_step(n, true), "the prompt is cut");
    for (int hh = 0; hh < H; ++hh) {
        CHECK(cache.length(0, hh) == n, "layer 0 keeps everything");
        CHECK(cache.length(1, hh) <= 80 && cache.length(1, hh) > 64, "head %d keeps within its 5 blocks (%d tokens)", hh,
              cache.length(1, hh));
        std::vector<float> k1(static_cast<size_t>(cache.length(1, hh)) * hd), v1(k1.size());
        cache.read(1, hh, k1.data(), v1.data());
        int found = 0;  // every high-scored token is among the kept rows
        const int first = hh == 0 ? 40 : 100;
        for (int t = first; t < first + 24; ++t)
            for (int r = 0; r < cache.length(1, hh); ++r)
                if (std::memcmp(&k1[static_cast<size_t>(r) * hd], &k[(static_cast<size_t>(t) * H + hh) * hd], hd * sizeof(float)) == 0) {
                    ++found;
                    break;
                }
        CHECK(found == 24, "head %d kept %d of its 24 high-scored tokens", hh, found);
        const std::vector<float> ts = cache.token_scores(1, hh);
        CHECK(std::all_of(ts.begin(), ts.end(), [](float x) { return std::isnan(x); }), "the update consumed the scores");
    }
    // A decode token's score waits for the next update like the prompt's did.
    std::vector<float> one_q(static_cast<size_t>(2 * H * hd), 0.1f), one_k(static_cast<size_t>(H * hd), 0.2f);
    step_all(cache, one_q, one_k, one_k, 1);
    const float s1[2] = {0.25f, 0.75f};
    cache.set_token_scores(1, s1, 1);
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(1, hh);
        CHECK(ts.back() == s1[hh], "head %d: the decode token's score is pending", hh);
    }
    KvCache kvzip(cc);
    kvzip.enable_eviction(kvzip_config(0.5));
    step_all(kvzip, q, k, v, n);
    CHECK(throws<std::invalid_argument>([&] { kvzip.set_token_scores(1, bad.data(), 1); }), "kvzip takes a pass, not scores");
}

// Float64: for kv head hh, each of the n keys' largest probability from the last W of n causal
// queries (every query head of the group G), the softmax over the keys each query sees.
// q [n][H][G][hd], k [n][H][hd].
static std::vector<double> window_peaks_f64(const std::vector<float>& q, const std::vector<float>& k, int H, int G,
                                            int hd, int n, int W, int hh) {
    std::vector<double> peak(n, 0.0);
    for (int i = n - W; i < n; ++i)
        for (int g = 0; g < G; ++g) {
            const float* qi = &q[((static_cast<size_t>(i) * H + hh) * G + g) * hd];
            std::vector<double> e(static_cast<size_t>(i) + 1);
            double mx = -1e300, sum = 0.0;
            for (int j = 0; j <= i; ++j) {
                double dot = 0.0;
                for (int d = 0; d < hd; ++d) dot += static_cast<double>(qi[d]) * k[(static_cast<size_t>(j) * H + hh) * hd + d];
                e[j] = dot / std::sqrt(static_cast<double>(hd));
                mx = std::max(mx, e[j]);
            }
            for (double& x : e) sum += x = std::exp(x - mx);
            for (int j = 0; j <= i; ++j) peak[j] = std::max(peak[j], e[j] / sum);
        }
    return peak;
}

// Query peaks (set_query_peaks) against float64: after a prompt chunk each token holds the larger
// of its predicted score and the largest probability the chunk's last observation_window queries
// (every query head of the group) give it; a one-token step (decode) adds none; off (the default
// after enable_eviction) the scores are the predictions; only predicted scores take them.
static void test_query_peaks() {
    std::mt19937 rng(47);
    const int H = 2, G = 2, hd = 32, n = 100, W = 8;
    KvCache cache(cache_config(1, H, 512));
    EvictionConfig h = kvzip_config(0.5);
    h.policy = "predicted_kvzip";
    h.observation_window = W;
    cache.enable_eviction(h);
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
    const auto q = random_vec(rng, static_cast<size_t>(n) * H * G * hd, 2.f);
    const float given = 1e-3f;
    const std::vector<float> s(static_cast<size_t>(H) * n, given);
    CHECK(!cache.query_peaks(), "off by default");
    step_all(cache, q, k, v, n);
    cache.set_token_scores(0, s.data(), n);
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(0, hh);
        CHECK(std::all_of(ts.begin(), ts.end(), [&](float x) { return x == given; }), "off: the predictions alone");
    }
    cache.enable_eviction(h);
    cache.reset();
    cache.set_query_peaks(true);
    step_all(cache, q, k, v, n);
    cache.set_token_scores(0, s.data(), n);
    std::vector<std::vector<double>> want(H);
    for (int hh = 0; hh < H; ++hh) {
        want[hh] = window_peaks_f64(q, k, H, G, hd, n, W, hh);
        for (double& x : want[hh]) x = std::max(x, static_cast<double>(given));
    }
    int above = 0;
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(0, hh);
        double worst = 0.0;
        for (int t = 0; t < n; ++t) {
            worst = std::max(worst, std::fabs(ts[t] - want[hh][t]) / want[hh][t]);
            above += want[hh][t] > given;
        }
        CHECK(worst < 1e-4, "head %d: token scores within %.2g of float64's max(score, window peak)", hh, worst);
    }
    CHECK(above > 2 * W, "the window's peaks lift %d tokens above the given score", above);
    std::vector<float> one_q(static_cast<size_t>(H) * G * hd, 1.f), one_k(static_cast<size_t>(H) * hd, 1.f);
    step_all(cache, one_q, one_k, one_k, 1);
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(0, hh);
        CHECK(std::isnan(ts[n]), "head %d: a decode step adds no peaks (its token has no score)", hh);
        bool same = true;
        for (int t = 0; t < n; ++t) same = same && std::fabs(ts[t] - want[hh][t]) <= 1e-4 * want[hh][t];
        CHECK(same, "head %d: the prompt's scores are unchanged by a decode step", hh);
    }
    cache.enable_eviction(h);
    CHECK(!cache.query_peaks(), "enable_eviction turns them off");
    KvCache kvzip(cache_config(1, H, 512));
    kvzip.enable_eviction(kvzip_config(0.5));
    CHECK(throws<std::invalid_argument>([&] { kvzip.set_query_peaks(true); }), "kvzip has its pass: no query peaks");
    kvzip.set_query_peaks(false);
}

// The prompt's end (set_prompt_end_share): after a prompt step with the share set, the share x
// keep ratio x length tokens of each head with the largest float64 window peaks (the step's last
// observation_window queries, every query head of the group) score 1 and are kept by the plan; the
// others keep their predictions; share 0 adds nothing; enable_eviction turns it off.
static void test_prompt_end() {
    std::mt19937 rng(53);
    const int H = 2, G = 2, hd = 32, n = 160, W = 8;
    const double share = 0.5, keep = 0.5;
    const int m = static_cast<int>(share * keep * n + 0.5);  // 40 of the 80 a head keeps
    KvCache cache(cache_config(1, H, 512));
    EvictionConfig h = kvzip_config(keep);
    h.policy = "predicted_kvzip";
    h.observation_window = W;
    cache.enable_eviction(h);
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
    const auto q = random_vec(rng, static_cast<size_t>(n) * H * G * hd, 2.f);
    const float given = 1e-3f;
    const std::vector<float> s(static_cast<size_t>(H) * n, given);
    CHECK(throws<std::invalid_argument>([&] { cache.set_prompt_end_share(1.5, n); }), "a share above 1");
    CHECK(throws<std::invalid_argument>([&] { cache.set_prompt_end_share(-0.1, n); }), "a negative share");
    CHECK(throws<std::invalid_argument>([&] { cache.set_prompt_end_share(0.5, 0); }), "a share without the prompt");
    step_all(cache, q, k, v, n);  // share 0: the predictions alone
    cache.set_token_scores(0, s.data(), n);
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<float> ts = cache.token_scores(0, hh);
        CHECK(std::all_of(ts.begin(), ts.end(), [&](float x) { return x == given; }), "share 0: the predictions alone");
    }
    cache.reset();
    cache.set_prompt_end_share(share, n);
    step_all(cache, q, k, v, n);
    cache.set_prompt_end_share(0.0, 0);
    cache.set_token_scores(0, s.data(), n);
    std::vector<std::vector<int>> chosen(H);
    for (int hh = 0; hh < H; ++hh) {
        const std::vector<double> peak = window_peaks_f64(q, k, H, G, hd, n, W, hh);
        const std::vector<float> ts = cache.token_scores(0, hh);
        int ones = 0;
        double kept_min = 1e300, left_max = 0.0;
        for (int t = 0; t < n; ++t) {
            CHECK(ts[t] == kKeptFirst || ts[t] == given, "head %d token %d: kept first or its prediction, got %g", hh, t,
                  ts[t]);
            if (ts[t] == kKeptFirst) {
                ++ones;
                chosen[hh].push_back(t);
                kept_min = std::min(kept_min, peak[t]);
            } else {
                left_max = std::max(left_max, peak[t]);
            }
        }
        CHECK(ones == m, "head %d: %d tokens kept first, want %d", hh, ones, m);
        CHECK(kept_min >= left_max * (1 - 1e-4), "head %d: the kept are float64's top peaks (%g against %g)", hh,
              kept_min, left_max);
    }
    CHECK(cache.end_step(n, true), "the prompt is cut");
    for (int hh = 0; hh < H; ++hh) {
        const int len = cache.length(0, hh);
        CHECK(len <= n / 2 + 16, "head %d keeps within its budget (%d)", hh, len);
        std::vector<float> k1(static_cast<size_t>(len) * hd), v1(k1.size());
        cache.read(0, hh, k1.data(), v1.data());
        int found = 0;  // every token that scored 1 is among the kept rows
        for (int t : chosen[hh])
            for (int r = 0; r < len; ++r)
                if (std::memcmp(&k1[static_cast<size_t>(r) * hd], &k[(static_cast<size_t>(t) * H + hh) * hd], hd * sizeof(float)) == 0) {
                    ++found;
                    break;
                }
        CHECK(found == m, "head %d kept %d of the %d window tokens", hh, found, m);
    }
    cache.set_prompt_end_share(share, n);
    cache.enable_eviction(h);
    CHECK(cache.prompt_end_share() == 0.0, "enable_eviction turns it off");
}

// A conversation's second prompt end: the first prompt's kept-first marks (on the blocks its plan
// made) are released, and the share is taken among the second prompt's own tokens alone: the
// share x keep ratio x its length of them with the largest float64 window peaks over everything
// the head holds. Without the release every turn's marks would pile up into score ties that the
// plan breaks by recency: a cache of the latest turns only.
static void test_prompt_end_turns() {
    std::mt19937 rng(59);
    const int H = 2, G = 2, hd = 32, n1 = 160, n2 = 64, W = 8;
    const double share = 0.5, keep = 0.5;
    KvCache cache(cache_config(1, H, 512));
    EvictionConfig h = kvzip_config(keep);
    h.policy = "predicted_kvzip";
    h.observation_window = W;
    cache.enable_eviction(h);
    // One prompt of n random tokens with the share, then its predictions; its queries back.
    const auto prompt = [&](int n) {
        const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
        const auto q = random_vec(rng, static_cast<size_t>(n) * H * G * hd, 2.f);
        cache.set_prompt_end_share(share, n);
        step_all(cache, q, k, v, n);
        cache.set_prompt_end_share(0.0, 0);
        const std::vector<float> s(static_cast<size_t>(H) * n, 1e-3f);
        cache.set_token_scores(0, s.data(), n);
        return q;
    };
    prompt(n1);
    CHECK(cache.end_step(n1, true), "the first prompt is cut");
    std::vector<int> held(H);
    for (int hh = 0; hh < H; ++hh) {
        held[hh] = cache.length(0, hh);
        int marked = 0;
        for (int b = 0; b < (held[hh] + 15) / 16; ++b) marked += cache.eviction_state()->reconstruction_score(0, hh, b) >= kKeptFirst;
        CHECK(marked > 0, "head %d: the first prompt's plan keeps its kept-first blocks marked", hh);
    }
    const std::vector<float> q2 = prompt(n2);
    const int m = static_cast<int>(share * keep * n2 + 0.5);
    for (int hh = 0; hh < H; ++hh) {
        const int len = cache.length(0, hh);
        CHECK(len == held[hh] + n2, "head %d holds the second prompt whole (%d)", hh, len);
        // The head's keys as held, one kv head: the float64 reference's layout with H = 1.
        std::vector<float> kh(static_cast<size_t>(len) * hd), vh(kh.size()), qh(static_cast<size_t>(len) * G * hd, 0.f);
        cache.read(0, hh, kh.data(), vh.data());
        for (int i = 0; i < n2; ++i)
            for (int g = 0; g < G; ++g)
                std::memcpy(&qh[((static_cast<size_t>(held[hh] + i)) * G + g) * hd], &q2[((static_cast<size_t>(i) * H + hh) * G + g) * hd],
                            hd * sizeof(float));
        const std::vector<double> peak = window_peaks_f64(qh, kh, 1, G, hd, len, W, 0);
        const std::vector<float> ts = cache.token_scores(0, hh);
        int kept = 0;
        double kept_min = 1e300, left_max = 0.0;
        for (int t = 0; t < len; ++t) {
            const bool own = t >= held[hh];
            CHECK(own || ts[t] < kKeptFirst, "head %d token %d of the first prompt: released, got %g", hh, t, ts[t]);
            if (!own) continue;
            if (ts[t] >= kKeptFirst) {
                ++kept;
                kept_min = std::min(kept_min, peak[t]);
            } else {
                left_max = std::max(left_max, peak[t]);
            }
        }
        CHECK(kept == m, "head %d: %d of the second prompt's tokens kept first, want %d", hh, kept, m);
        CHECK(kept_min >= left_max * (1 - 1e-4), "head %d: the kept are its own tokens' float64 top peaks (%g against %g)",
              hh, kept_min, left_max);
    }
}

// Decode under a global budget: a plan made exactly to the budget is followed by another at the
// next block boundary of any head, so a decode plan keeps one block per head in hand. Counted
// here: the cache never holds more blocks than the budget, and plans come every ~headroom /
// growth steps, not nearly every step.
static void test_decode_headroom() {
    std::mt19937 rng(41);
    const int L = 2, H = 2, hd = 32, n = 2048, steps = 256, bt = 16;  // 64 blocks a head: 1/64 is a block
    KvCache cache(cache_config(L, H, 4096));
    EvictionConfig h = kvzip_config(0.5);
    h.policy = "predicted_kvzip";
    h.layer_budget = "global";
    h.update_interval = 100000;  // only the budget triggers a plan
    cache.enable_eviction(h);
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd), v = random_vec(rng, k.size());
    const auto q = random_vec(rng, static_cast<size_t>(n) * 2 * H * hd);
    std::uniform_real_distribution<float> u(0.001f, 0.9f);
    auto give_scores = [&](int count) {
        std::vector<float> s(static_cast<size_t>(H) * count);
        for (float& x : s) x = u(rng);
        for (int layer = 0; layer < L; ++layer) cache.set_token_scores(layer, s.data(), count);
    };
    step_all(cache, q, k, v, n);
    give_scores(n);
    CHECK(cache.end_step(n, true), "the prompt is cut");
    auto held_blocks = [&] {
        int b = 0;
        for (int layer = 0; layer < L; ++layer)
            for (int hh = 0; hh < H; ++hh) b += (cache.length(layer, hh) + bt - 1) / bt;
        return b;
    };
    const int pooled_prompt = L * H * cache.eviction_state()->budget_blocks(n);
    CHECK(held_blocks() == pooled_prompt, "the prompt's cut is exactly to the budget (%d of %d blocks)", held_blocks(),
          pooled_prompt);
    int plans = 0, over = 0;
    for (int t = 0; t < steps; ++t) {
        const auto q1 = random_vec(rng, static_cast<size_t>(2 * H * hd)), k1 = random_vec(rng, static_cast<size_t>(H * hd));
        step_all(cache, q1, k1, k1, 1);
        give_scores(1);
        plans += cache.end_step(1, false) ? 1 : 0;
        const int pooled = L * H * cache.eviction_state()->budget_blocks(n + t + 1);
        over += held_blocks() > pooled ? 1 : 0;
    }
    CHECK(over == 0, "the cache never holds more blocks than its budget (%d steps over)", over);
    // Growth 4 heads x (1 - 0.5) tokens a step against 4 blocks of headroom: a plan every ~32 steps.
    CHECK(plans >= steps / 64 && plans <= steps / 16, "%d plans in %d decode steps", plans, steps);
}

int main() {
    test_block_max();
    test_pass();
    test_window_pass(KvDtype::F32);
    test_window_pass(KvDtype::Q8);
    test_global_budget();
    test_predicted_scores();
    test_query_peaks();
    test_prompt_end();
    test_prompt_end_turns();
    test_decode_headroom();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all reconstruction tests passed\n");
    return 0;
}
