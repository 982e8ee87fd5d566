// kvzip at token granularity (docs/eviction.md "Reconstruction"):
// - token_peaks (scalar reference, AVX2 with and without threads) against a float64 brute force:
//   GQA groups, causal visibility, heads of different lengths, peaks kept for a prefix only, a
//   workspace reused from a larger problem;
// - a pass through KvCache (f16, q8 and a rotated dtype) gives every context token the largest
//   probability the pass's queries gave it, over both chunks (a rewind drops the pass's keys only);
// - the first update after a pass keeps exactly the floors plus the highest-peak tokens under the
//   global budget, within the budget's blocks; new blocks score the max of their kept tokens.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/eviction/token_peaks.h"
#include "mnn_h2o/runtime/thread_pool.h"

#include "test_support.h"

using namespace mnn_h2o;

// peak[h][j] = max over queries i, query heads g of the group: softmax over keys [0, visible_i).
static void brute_force(const std::vector<float>& q, int n_q, int H, int G, int hd,
                        const std::vector<std::vector<float>>& k, const std::vector<int>& n_keys,
                        const std::vector<int>& n_peak, std::vector<std::vector<double>>* peak) {
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < n_q; ++i)
            for (int g = 0; g < G; ++g) {
                const float* qr = &q[(static_cast<size_t>(i) * H * G + h * G + g) * hd];
                const int visible = n_keys[h] - n_q + i + 1;
                std::vector<double> s(visible);
                double m = -INFINITY, l = 0;
                for (int j = 0; j < visible; ++j) {
                    double dot = 0;
                    for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * k[h][static_cast<size_t>(j) * hd + d];
                    m = std::max(m, s[j] = dot / std::sqrt(static_cast<double>(hd)));
                }
                for (double x : s) l += std::exp(x - m);
                for (int j = 0; j < std::min(visible, n_peak[h]); ++j)
                    (*peak)[h][j] = std::max((*peak)[h][j], std::exp(s[j] - m) / l);
            }
}

static void test_routine() {
    std::mt19937 rng(11);
    ThreadPool pool(3);
    const int H = 2, G = 3, hd = 64;
    // One workspace per ISA and threading, reused by every problem: a smaller problem after a
    // larger one finds its scratch holding the larger one's panels and scores.
    TokenPeakWorkspace reused[2][2];
    for (int n_q : {37, 130, 1, 5}) {
        // Head 1 holds fewer keys than head 0 (a per-head budget), and a prior peak on key 2.
        const std::vector<int> n_keys = {n_q + 90, n_q + 61}, n_peak = {90, 45};
        std::vector<std::vector<float>> k(H);
        std::vector<const float*> kp(H);
        for (int h = 0; h < H; ++h) {
            k[h] = random_vec(rng, static_cast<size_t>(n_keys[h]) * hd);
            kp[h] = k[h].data();
        }
        const auto q = random_vec(rng, static_cast<size_t>(n_q) * H * G * hd, 2.f);
        std::vector<std::vector<double>> ref(H, std::vector<double>(128, 0.0));
        ref[0][2] = 0.999;
        brute_force(q, n_q, H, G, hd, k, n_keys, n_peak, &ref);
        std::vector<float> scalar;
        for (Isa isa : {Isa::Scalar, Isa::Avx2}) {
            if (!isa_available(isa)) continue;
            for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
                std::vector<float> peak(2 * 128, 0.f);
                peak[2] = 0.999f;
                TokenPeakProblem p;
                p.n_kv_heads = H;
                p.group = G;
                p.head_dim = hd;
                p.q = q.data();
                p.n_q = n_q;
                p.k = kp.data();
                p.n_keys = n_keys.data();
                p.n_peak = n_peak.data();
                p.peak = peak.data();
                p.peak_stride = 128;
                token_peaks(p, isa, tp, reused[isa != Isa::Scalar][tp != nullptr]);
                const std::string what = std::string(isa_name(isa)) + " n_q=" + std::to_string(n_q) + (tp ? " threads" : "");
                double err = 0;
                for (int h = 0; h < H; ++h)
                    for (int j = 0; j < 128; ++j) {
                        const double want = j < n_peak[h] || (h == 0 && j == 2) ? ref[h][j] : 0.0;
                        err = std::max(err, std::fabs(peak[h * 128 + j] - want) / std::max(want, 1e-3));
                    }
                CHECK(err < 1e-4, "%s: rel err %.3g vs float64 (keys past n_peak untouched)", what.c_str(), err);
                CHECK(peak[2] == 0.999f, "%s: a larger prior peak stays", what.c_str());
                if (isa == Isa::Scalar) scalar = peak;
                double d = 0;
                for (size_t i = 0; i < peak.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(peak[i]) - scalar[i]));
                CHECK(d < 1e-5, "%s: differs from scalar by %.3g", what.c_str(), d);
            }
        }
    }
    TokenPeakProblem bad;  // fewer keys than queries
    std::vector<float> q(64), k(64), peak(1);
    const float* kp[1] = {k.data()};
    const int n_keys[1] = {1}, n_peak[1] = {1};
    bad.n_kv_heads = bad.group = 1;
    bad.head_dim = 64;
    bad.q = q.data();
    bad.n_q = 2;
    bad.k = kp;
    bad.n_keys = n_keys;
    bad.n_peak = n_peak;
    bad.peak = peak.data();
    bad.peak_stride = 1;
    TokenPeakWorkspace ws;
    CHECK(throws<std::invalid_argument>([&] { token_peaks(bad, Isa::Scalar, nullptr, ws); }), "n_keys < n_q is malformed");
}

static KvCacheConfig config(int L, int H, int hd, KvDtype dt) {
    KvCacheConfig c;
    c.n_layers = L;
    c.n_kv_heads = H;
    c.head_dim = hd;
    c.n_heads = 3 * H;
    c.dtype = dt;
    c.block_tokens = 16;
    c.max_tokens = 1024;
    c.threads = 2;
    return c;
}

static EvictionConfig kvzip(double keep, const char* layer_budget) {
    EvictionConfig h;
    h.policy = "kvzip";
    h.target_keep_ratio = keep;
    h.sink_tokens = 4;
    h.recent_tokens = 8;
    h.trigger_min_tokens = 0;
    h.update_interval = 1;
    h.layer_budget = layer_budget;
    return h;
}

static void step_all(KvCache& cache, const std::vector<float>& q, const std::vector<float>& k, int n) {
    const KvCacheConfig& c = cache.config();
    std::vector<float> out(static_cast<size_t>(n) * c.n_heads * c.head_dim);
    for (int layer = 0; layer < c.n_layers; ++layer) cache.step(layer, q.data(), k.data(), k.data(), n, out.data());
}

// A two-chunk pass through the cache: every context token's score is the brute force's peak over
// both chunks' queries (each chunk seeing the context and itself), whatever the dtype.
static void test_pass_peaks() {
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8, KvDtype::Q8R}) {
        std::mt19937 rng(21);
        const int L = 2, H = 2, G = 3, hd = 64, n = 150, chunk[2] = {20, 33};
        KvCache cache(config(L, H, hd, dt));
        cache.enable_eviction(kvzip(0.5, "global"));
        step_all(cache, random_vec(rng, static_cast<size_t>(n) * H * G * hd), random_vec(rng, static_cast<size_t>(n) * H * hd), n);
        std::vector<std::vector<std::vector<double>>> ref(L, std::vector<std::vector<double>>(H, std::vector<double>(n, 0.0)));
        cache.begin_reconstruction();
        for (int c = 0; c < 2; ++c) {
            const auto q = random_vec(rng, static_cast<size_t>(chunk[c]) * H * G * hd, 2.f);
            step_all(cache, q, random_vec(rng, static_cast<size_t>(chunk[c]) * H * hd), chunk[c]);
            for (int layer = 0; layer < L; ++layer) {
                std::vector<std::vector<float>> k(H);
                for (int h = 0; h < H; ++h) {  // the keys as stored (read gives them unrotated: q is too)
                    k[h].resize(static_cast<size_t>(n + chunk[c]) * hd);
                    std::vector<float> v(k[h].size());
                    cache.read(layer, h, k[h].data(), v.data());
                }
                brute_force(queries_seen(dt, q, chunk[c], hd), chunk[c], H, G, hd, k, {n + chunk[c], n + chunk[c]}, {n, n}, &ref[layer]);
            }
            cache.rewind_reconstruction();
        }
        cache.end_reconstruction();
        const EvictionState* s = cache.eviction_state();
        double err = 0;
        for (int layer = 0; layer < L; ++layer) {
            CHECK(s->token_peaks_pending(layer), "%s: layer %d: peaks wait for the update", kv_dtype_name(dt), layer);
            for (int h = 0; h < H; ++h) {
                for (int t = 0; t < n; ++t)
                    err = std::max(err, std::fabs(s->token_score(layer, h, t) - ref[layer][h][t]) / std::max(ref[layer][h][t], 1e-3));
                // The block scores stay the kernels' block peaks: the max of their tokens' (the
                // last block, partial, also held some of the pass's keys while it ran).
                int nb = 0;
                const std::vector<float> blocks = cache.eviction_scores(layer, &nb, true);
                for (int b = 0; b < n / 16; ++b) {
                    double m = 0;
                    for (int t = b * 16; t < std::min(n, b * 16 + 16); ++t) m = std::max(m, ref[layer][h][t]);
                    err = std::max(err, std::fabs(blocks[static_cast<size_t>(h) * nb + b] - m) / std::max(m, 1e-3));
                }
            }
        }
        CHECK(err < 2e-4, "%s: token peaks rel err %.3g vs float64", kv_dtype_name(dt), err);
    }
}

// The first update after a pass: tokens chosen by peak under one global budget; bytes within it.
static void test_token_plan() {
    std::mt19937 rng(31);
    const int L = 3, H = 2, G = 3, hd = 32, n = 200, B = 16;
    KvCache cache(config(L, H, hd, KvDtype::F32));
    EvictionConfig hc = kvzip(0.4, "global");
    hc.layer_start = 1;  // layer 0 keeps everything
    cache.enable_eviction(hc);
    const auto k = random_vec(rng, static_cast<size_t>(n) * H * hd);
    step_all(cache, random_vec(rng, static_cast<size_t>(n) * H * G * hd), k, n);
    cache.begin_reconstruction();
    step_all(cache, random_vec(rng, static_cast<size_t>(40) * H * G * hd, 3.f), random_vec(rng, static_cast<size_t>(40) * H * hd), 40);
    cache.end_reconstruction();
    const EvictionState* s = cache.eviction_state();
    // Expected: per head floors (4 sink, 8 recent), then the top extra tokens of all heads by peak.
    const int budget = s->budget_blocks(n, 1);  // ceil(0.4 * 200 / 16) = 5 blocks per head
    const int pooled = budget * (L - 1) * H;
    struct Cand { float score; int head, t; };
    std::vector<Cand> cand;
    std::vector<std::vector<float>> score((L - 1) * H, std::vector<float>(n));
    for (int i = 0; i < (L - 1) * H; ++i)
        for (int t = 0; t < n; ++t) {
            score[i][t] = s->token_score(1 + i / H, i % H, t);
            if (t >= 4 && t < n - 8) cand.push_back({score[i][t], i, t});
        }
    std::sort(cand.begin(), cand.end(), [](const Cand& a, const Cand& b) { return a.score > b.score; });
    const int extra = pooled * B - (L - 1) * H * 12;
    std::vector<std::vector<uint8_t>> top((L - 1) * H, std::vector<uint8_t>(n, 0));
    for (int c = 0; c < extra; ++c) top[cand[c].head][cand[c].t] = 1;
    const size_t bytes_before = cache.bytes_held();
    CHECK(cache.end_step(n, true), "the update evicts");
    int blocks = 0, trimmed_heads = 0;
    for (int i = 0; i < (L - 1) * H; ++i) {
        const int layer = 1 + i / H, h = i % H, len = cache.length(layer, h);
        blocks += (len + B - 1) / B;
        std::vector<float> kk(static_cast<size_t>(len) * hd), vv(kk.size());
        cache.read(layer, h, kk.data(), vv.data());
        // Which original tokens were kept: f32 rows are exact.
        std::vector<int> kept;
        for (int r = 0, t = 0; r < len; ++r) {
            while (t < n && std::memcmp(&kk[static_cast<size_t>(r) * hd], &k[(static_cast<size_t>(t) * H + h) * hd], hd * sizeof(float)) != 0) ++t;
            kept.push_back(t++);
        }
        CHECK(kept.back() == n - 1 && kept[len - 8] == n - 8 && kept[3] == 3, "head %d: floors kept", i);
        int missing = 0;
        bool in_top = true;
        for (int t : kept)
            if (t >= 4 && t < n - 8) in_top = in_top && top[i][t];
        for (int t = 4; t < n - 8; ++t) missing += top[i][t] && !std::binary_search(kept.begin(), kept.end(), t);
        CHECK(in_top, "head %d keeps only top-peak tokens", i);
        // A head may only have given up its partial last block (its lowest kept tokens).
        CHECK(missing == 0 || (missing < B && len % B == 0), "head %d: %d top tokens dropped", i, missing);
        trimmed_heads += missing > 0;
        // Its new blocks score the max of their kept tokens.
        int nb = 0;
        const std::vector<float> rs = cache.eviction_scores(layer, &nb, true);
        for (int b = 0; b * B < len; ++b) {
            float m = -1;
            for (int r = b * B; r < std::min(len, b * B + B); ++r) m = std::max(m, score[i][kept[r]]);
            CHECK(rs[static_cast<size_t>(h) * nb + b] == m, "head %d block %d: score %g, max of its tokens %g", i, b,
                  rs[static_cast<size_t>(h) * nb + b], m);
        }
        CHECK(!s->token_peaks_pending(layer), "layer %d: the peaks are dropped after the update", layer);
    }
    CHECK(blocks <= pooled && blocks >= pooled - (L - 1) * H, "%d blocks held, budget %d", blocks, pooled);
    std::printf("token plan: %d of %d budget blocks, %d heads trimmed, %zu -> %zu bytes\n", blocks, pooled,
                trimmed_heads, bytes_before, cache.bytes_held());
    // Later updates are block-level again: a decode token and an update keep the budget.
    step_all(cache, random_vec(rng, static_cast<size_t>(H) * G * hd), random_vec(rng, static_cast<size_t>(H) * hd), 1);
    cache.end_step(1, false);
    int after = 0;
    for (int i = 0; i < (L - 1) * H; ++i) after += (cache.length(1 + i / H, i % H) + B - 1) / B;
    CHECK(after <= s->budget_blocks(n + 1, 1) * (L - 1) * H, "a decode update keeps the budget (%d blocks)", after);
}

int main() {
    test_routine();
    test_pass_peaks();
    test_token_plan();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all token peak tests passed\n");
    return 0;
}
