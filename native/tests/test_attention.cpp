// Attention kernels: every available ISA against a float64 reference and against the scalar
// kernels, over dtypes, GQA groups, head sizes, block sizes, odd lengths, chunked prefill,
// threads and per-head lengths; plus the fp16/bf16 conversions.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/runtime/thread_pool.h"

#include "test_support.h"

using namespace mnn_h2o;

static std::vector<Isa> available_isas() {
    std::vector<Isa> isas;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
        if (isa_available(isa)) isas.push_back(isa);
    return isas;
}

struct Reference {
    std::vector<double> out;     // [n_q][n_heads*hd]
    std::vector<double> scores;  // [n_kv][max_blocks]
};

// float64 attention over what the cache holds (read back as float, so dtype rounding is shared);
// with the layer's sliding window each query sees only the newest `window` of its keys.
static Reference reference(const KvCache& cache, int layer, const std::vector<float>& q, int n_q) {
    const int window = cache.window(layer);
    const KvCacheConfig& c = cache.config();
    const int hd = c.head_dim, G = cache.group(), mb = cache.max_blocks();
    Reference ref;
    ref.out.assign(static_cast<size_t>(n_q) * c.n_heads * hd, 0.0);
    ref.scores.assign(static_cast<size_t>(c.n_kv_heads) * mb, 0.0);
    const std::vector<float> seen = queries_seen(c.dtype, q, n_q, hd);
    for (int h = 0; h < c.n_kv_heads; ++h) {
        const int len = cache.length(layer, h);
        std::vector<float> k(static_cast<size_t>(len) * hd), v(k.size());
        cache.read(layer, h, k.data(), v.data());
        for (int t = 0; t < n_q; ++t) {
            const int visible = len - n_q + t + 1, first = window ? std::max(0, visible - window) : 0;
            for (int g = 0; g < G; ++g) {
                const float* qr = &seen[(static_cast<size_t>(t) * c.n_heads + h * G + g) * hd];
                std::vector<double> s(visible, -INFINITY);
                double m = -INFINITY;
                for (int j = first; j < visible; ++j) {
                    double dot = 0;
                    for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * k[static_cast<size_t>(j) * hd + d];
                    s[j] = dot / std::sqrt(static_cast<double>(hd));
                    m = std::max(m, s[j]);
                }
                double l = 0;
                for (double& x : s) l += (x = std::exp(x - m));  // exp(-inf) = 0 outside the window
                double* o = &ref.out[(static_cast<size_t>(t) * c.n_heads + h * G + g) * hd];
                for (int j = 0; j < visible; ++j) {
                    const double p = s[j] / l;
                    for (int d = 0; d < hd; ++d) o[d] += p * v[static_cast<size_t>(j) * hd + d];
                    ref.scores[static_cast<size_t>(h) * mb + j / c.block_tokens] += p;
                }
            }
        }
    }
    return ref;
}

// max |a - b| / (max |b| + tiny)
template <class A, class B>
static double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
    double err = 0, mag = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
        mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
    }
    return err / mag;
}

struct Case {
    int n_kv, group, hd, bt;
    KvDtype dtype;
    std::vector<int> chunks;  // tokens appended by successive step() calls; the last is checked
    int threads;
};

static std::string describe(const Case& c, Isa isa) {
    std::string s = std::string(isa_name(isa)) + " " + kv_dtype_name(c.dtype) + " kv=" + std::to_string(c.n_kv) +
                    " g=" + std::to_string(c.group) + " hd=" + std::to_string(c.hd) + " bt=" + std::to_string(c.bt) +
                    " threads=" + std::to_string(c.threads) + " chunks=";
    for (int n : c.chunks) s += std::to_string(n) + ",";
    return s;
}

// A two-layer cache of the given head geometry and dtype, room for 4096 tokens.
static KvCacheConfig two_layer_config(int n_kv, int group, int hd, int bt, KvDtype dtype, int threads) {
    KvCacheConfig cfg;
    cfg.n_layers = 2;
    cfg.n_kv_heads = n_kv;
    cfg.head_dim = hd;
    cfg.n_heads = n_kv * group;
    cfg.dtype = dtype;
    cfg.block_tokens = bt;
    cfg.max_tokens = 4096;
    cfg.threads = threads;
    return cfg;
}

// Fills a cache through step() with the case's chunks, then checks the last call's output and
// block scores against the float64 reference, for every ISA.
static void run_case(const Case& c, std::mt19937& rng) {
    if (!kv_dtype_shape_error(c.dtype, c.hd).empty()) return;  // e.g. q8 with head_dim 80
    const KvCacheConfig cfg = two_layer_config(c.n_kv, c.group, c.hd, c.bt, c.dtype, c.threads);
    KvCache cache(cfg);
    const int layer = 1, row = cfg.n_heads * c.hd, kv_row = c.n_kv * c.hd;
    for (size_t i = 0; i + 1 < c.chunks.size(); ++i) {
        const int n = c.chunks[i];
        auto q = random_vec(rng, static_cast<size_t>(n) * row, 1.f);
        auto k = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
        auto v = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
        std::vector<float> out(static_cast<size_t>(n) * row);
        cache.step(layer, q.data(), k.data(), v.data(), n, out.data());
    }
    const int n_q = c.chunks.back();
    // Larger q spreads the softmax (peaky rows test the max subtraction).
    auto q = random_vec(rng, static_cast<size_t>(n_q) * row, 2.f);
    auto k = random_vec(rng, static_cast<size_t>(n_q) * kv_row, 1.f);
    auto v = random_vec(rng, static_cast<size_t>(n_q) * kv_row, 1.f);
    cache.append(layer, k.data(), v.data(), n_q);
    const Reference ref = reference(cache, layer, q, n_q);

    std::vector<float> scalar_out;
    for (Isa isa : available_isas()) {
        std::vector<float> out(static_cast<size_t>(n_q) * row, NAN);
        std::vector<float> scores(static_cast<size_t>(c.n_kv) * cache.max_blocks(), 0.f);
        cache.attend(layer, q.data(), n_q, out.data(), scores.data(), cache.max_blocks(), isa);
        const double e_out = rel_err(out, ref.out), e_scores = rel_err(scores, ref.scores);
        const double tol = attention_tolerance(isa, c.dtype, n_q);
        CHECK(e_out < tol, "%s: output rel err %.3g vs float64", describe(c, isa).c_str(), e_out);
        CHECK(e_scores < 2e-5, "%s: block score rel err %.3g vs float64", describe(c, isa).c_str(), e_scores);
        for (int h = 0; h < c.n_kv; ++h) {
            double total = 0;
            for (int b = 0; b < cache.max_blocks(); ++b) total += scores[static_cast<size_t>(h) * cache.max_blocks() + b];
            const double want = static_cast<double>(n_q) * c.group;
            CHECK(std::fabs(total - want) < 1e-4 * want, "%s: head %d scores sum %.6f, want %.0f",
                  describe(c, isa).c_str(), h, total, want);
        }
        if (isa == Isa::Scalar) scalar_out = out;
        else {
            const double e = rel_err(out, scalar_out);
            CHECK(e < (tol > 2e-5 ? tol : 1e-5), "%s: rel err %.3g vs scalar", describe(c, isa).c_str(), e);
        }
    }
}

static void test_against_reference() {
    std::mt19937 rng(1234);
    const std::vector<KvDtype> dtypes = {KvDtype::F16, KvDtype::BF16, KvDtype::F32, KvDtype::Q8, KvDtype::Q4, KvDtype::Q4R, KvDtype::Q8R};
    for (KvDtype dt : dtypes) {
        // Decode over odd lengths, GQA groups, head sizes, block sizes.
        run_case({3, 3, 64, 64, dt, {1}, 1}, rng);
        run_case({3, 3, 64, 64, dt, {37, 1}, 1}, rng);
        run_case({3, 3, 64, 64, dt, {63, 1}, 1}, rng);
        run_case({3, 3, 64, 64, dt, {64, 1}, 1}, rng);
        run_case({2, 4, 80, 16, dt, {300, 1, 1}, 1}, rng);
        run_case({1, 8, 128, 128, dt, {129, 2}, 1}, rng);
        run_case({2, 1, 256, 32, dt, {70, 3}, 1}, rng);
        run_case({1, 5, 16, 16, dt, {33, 1}, 1}, rng);
        // Decode's passes over the keys: a 1.5B's group of 6 (one pass where the set takes 6
        // rows), 7 (two uneven passes), 12 (two or more).
        run_case({2, 6, 128, 16, dt, {90, 1}, 1}, rng);
        run_case({1, 7, 64, 16, dt, {40, 1}, 1}, rng);
        run_case({1, 12, 32, 16, dt, {50, 1}, 1}, rng);
        // Prefill (tile path) with causal masks inside blocks, partial tiles and a chunked tail.
        run_case({3, 3, 64, 64, dt, {200}, 1}, rng);
        run_case({3, 3, 64, 64, dt, {100, 77}, 1}, rng);
        run_case({2, 4, 80, 16, dt, {45, 19}, 1}, rng);
        run_case({1, 1, 32, 64, dt, {5, 40}, 1}, rng);
        run_case({2, 2, 256, 64, dt, {3, 130}, 1}, rng);
    }
    // Threads: decode split over key ranges (from kSplitMinProducts query-key products; below
    // kParallelMinQueryKeys the cache's ThreadPool runs the splits on the caller) and parallel tiles.
    run_case({2, 6, 128, 16, KvDtype::Q8R, {400, 1}, 2}, rng);
    run_case({3, 3, 64, 64, KvDtype::F16, {1500, 1}, 2}, rng);
    run_case({3, 3, 64, 64, KvDtype::F16, {1100, 1, 2}, 3}, rng);
    run_case({2, 4, 80, 16, KvDtype::BF16, {1030, 1}, 2}, rng);
    run_case({3, 3, 64, 64, KvDtype::F32, {700, 333}, 2}, rng);
    run_case({1, 8, 64, 64, KvDtype::F16, {5, 1300}, 2}, rng);
    run_case({3, 3, 64, 16, KvDtype::Q8, {1500, 1}, 2}, rng);
    run_case({3, 3, 64, 16, KvDtype::Q4R, {700, 333}, 2}, rng);
}

// A prefill in one call and the same prefill in chunks give the same attention output.
static void test_chunked_prefill() {
    std::mt19937 rng(99);
    for (Isa isa : available_isas()) {
        KvCacheConfig cfg = kv_config(1, 3, 64, 9, KvDtype::F16, 64, 1024, 1);
        KvCache full(cfg), chunked(cfg);
        const int n = 333, row = 9 * 64, kv_row = 3 * 64;
        auto q = random_vec(rng, static_cast<size_t>(n) * row, 1.5f);
        auto k = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
        auto v = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
        std::vector<float> out_full(static_cast<size_t>(n) * row), out_chunked(out_full.size());
        std::vector<float> s_full(3 * full.max_blocks(), 0.f), s_chunked(s_full.size(), 0.f);
        full.append(0, k.data(), v.data(), n);
        full.attend(0, q.data(), n, out_full.data(), s_full.data(), full.max_blocks(), isa);
        for (int t0 = 0, step = 1; t0 < n; t0 += step, step = step * 3 + 1) {
            const int m = std::min(step, n - t0);
            chunked.append(0, &k[static_cast<size_t>(t0) * kv_row], &v[static_cast<size_t>(t0) * kv_row], m);
            chunked.attend(0, &q[static_cast<size_t>(t0) * row], m, &out_chunked[static_cast<size_t>(t0) * row],
                           s_chunked.data(), chunked.max_blocks(), isa);
        }
        const double e = rel_err(out_chunked, out_full), es = rel_err(s_chunked, s_full);
        CHECK(e < 1e-5, "%s: chunked vs full prefill rel err %.3g", isa_name(isa), e);
        CHECK(es < 1e-5, "%s: chunked vs full block scores rel err %.3g", isa_name(isa), es);
    }
}

// Heads of one layer may hold different numbers of tokens; each attends causally to its own.
static void test_uneven_heads() {
    std::mt19937 rng(7);
    KvCacheConfig cfg = kv_config(1, 3, 64, 6, KvDtype::F16, 32, 512, 1);
    KvCache cache(cfg);
    const int row = 6 * 64, kv_row = 3 * 64;
    auto k = random_vec(rng, 200 * kv_row, 1.f), v = random_vec(rng, 200 * kv_row, 1.f);
    cache.append(0, k.data(), v.data(), 200);
    cache.truncate(0, 1, 70);
    cache.truncate(0, 2, 5);
    for (int n_q : {1, 4, 40}) {
        auto q = random_vec(rng, static_cast<size_t>(n_q) * row, 1.f);
        auto kn = random_vec(rng, static_cast<size_t>(n_q) * kv_row, 1.f), vn = random_vec(rng, kn.size(), 1.f);
        cache.append(0, kn.data(), vn.data(), n_q);
        const Reference ref = reference(cache, 0, q, n_q);
        for (Isa isa : available_isas()) {
            std::vector<float> out(static_cast<size_t>(n_q) * row);
            std::vector<float> scores(3 * cache.max_blocks(), 0.f);
            cache.attend(0, q.data(), n_q, out.data(), scores.data(), cache.max_blocks(), isa);
            CHECK(rel_err(out, ref.out) < 2e-5, "%s n_q=%d: uneven heads output", isa_name(isa), n_q);
            CHECK(rel_err(scores, ref.scores) < 2e-5, "%s n_q=%d: uneven heads scores", isa_name(isa), n_q);
        }
    }
}

static void test_errors() {
    KvCacheConfig cfg = kv_config(2, 2, 64, 4, KvDtype::F16, 64, 100, 1);
    KvCache cache(cfg);
    std::vector<float> k(101 * 128, 0.f), q(101 * 256, 0.f), out(q.size());
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, q.data(), 1, out.data()); }), "attend on empty cache");
    CHECK(throws<std::length_error>([&] { cache.append(0, k.data(), k.data(), 101); }), "append past max_tokens");
    CHECK(cache.length(0, 0) == 0 && cache.bytes_held() == 0, "failed append left state");
    CHECK(throws<std::out_of_range>([&] { cache.append(2, k.data(), k.data(), 1); }), "layer out of range");
    CHECK(throws<std::out_of_range>([&] { cache.length(0, 2); }), "head out of range");
    cache.append(0, k.data(), k.data(), 10);
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, q.data(), 11, out.data()); }), "n_q > length");
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, q.data(), 2, q.data() + 10); }), "out overlaps q");
    const Isa missing = isa_available(Isa::Neon) ? Isa::Avx2 : Isa::Neon;
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, q.data(), 1, out.data(), nullptr, 0, missing); }),
          "unavailable isa");
    std::vector<float> row(cache.max_blocks() * 2, 0.f);
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, q.data(), 1, out.data(), row.data(), 0); }),
          "scores without a stride");
    std::vector<float> scores(8, 0.f);
    CHECK(throws<std::invalid_argument>([&] { cache.step(0, q.data(), k.data(), k.data(), 90, out.data(), scores.data(), 1); }),
          "scores stride too small");
    CHECK(cache.length(0, 0) == 10, "failed step must not append");
    {  // q8 rows are only for a q8 cache's prompt queries
        KvHeadView views[2] = {cache.view(0, 0), cache.view(0, 1)};
        AttentionProblem p;
        p.n_kv_heads = 2;
        p.group = 2;
        p.head_dim = 64;
        p.block_tokens = 64;
        p.dtype = KvDtype::F16;
        p.heads = views;
        p.q = q.data();
        p.n_q = 2;
        p.out = out.data();
        std::vector<uint8_t> codes(4 * 2 * kv_row_bytes(KvDtype::Q8, 64));
        p.q8_rows = codes.data();
        AttentionWorkspace ws;
        CHECK(throws<std::invalid_argument>([&] { attention(p, Isa::Scalar, nullptr, ws); }), "q8 rows for an f16 cache");
    }
    for (auto bad : {kv_config(0, 1, 64, 1), kv_config(1, 2, 64, 3), kv_config(1, 1, 72, 1),
                     kv_config(1, 1, 512, 1), kv_config(1, 1, 64, 1, KvDtype::F16, 24),
                     kv_config(1, 1, 64, 1, KvDtype::F16, 64, 0), kv_config(1, 1, 64, 1, KvDtype::F16, 64, 8, 0)})
        CHECK(throws<std::invalid_argument>([&] { KvCache c(bad); }), "bad config accepted");
}

// Every ISA's fp32 -> fp16/bf16 conversion writes the same bits as fp16.h, and back.
static void test_conversions() {
    std::mt19937 rng(5);
    std::vector<float> src;
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                                 0xFFBFFFFFu, 0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x38800000u,
                                 0x387FFFFFu, 0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x00000001u, 0x3F800000u};
    for (uint32_t u : specials) src.push_back(f32_from_bits(u));
    // Every half-way point between neighbouring fp16 values, and one ulp either side.
    for (uint32_t h = 0; h < 0x7C00u; ++h) {
        const double a = fp16_to_fp32(static_cast<uint16_t>(h)), b = fp16_to_fp32(static_cast<uint16_t>(h + 1));
        const float mid = static_cast<float>((a + b) / 2);
        for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
            src.push_back(x);
            src.push_back(-x);
        }
    }
    for (int i = 0; i < 200000; ++i) src.push_back(f32_from_bits(static_cast<uint32_t>(rng())));
    src.resize(src.size() / 16 * 16);  // rows of 16

    for (KvDtype dt : {KvDtype::F16, KvDtype::BF16}) {
        std::vector<uint16_t> want(src.size());
        for (size_t i = 0; i < src.size(); ++i)
            want[i] = dt == KvDtype::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
        std::vector<uint16_t> all(65536);
        for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
        std::vector<float> all_want(65536);
        for (uint32_t i = 0; i < 65536; ++i) all_want[i] = dt == KvDtype::F16 ? fp16_to_fp32(all[i]) : bf16_to_fp32(all[i]);
        for (Isa isa : available_isas()) {
            std::vector<uint16_t> got(src.size());
            convert_from_f32(isa, dt, src.data(), got.data(), src.size() / 16, 16);
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < src.size(); ++i)
                if (got[i] != want[i] && !bad++) first = i;
            CHECK(bad == 0, "%s %s from_f32: %zu mismatches, first %08x -> %04x want %04x", isa_name(isa),
                  kv_dtype_name(dt), bad, f32_bits(src[first]), got[first], want[first]);
            std::vector<float> back(65536);
            convert_to_f32(isa, dt, all.data(), back.data(), all.size() / 16, 16);
            bad = 0;
            for (size_t i = 0; i < 65536; ++i)
                if (f32_bits(back[i]) != f32_bits(all_want[i]) && !bad++) first = i;
            CHECK(bad == 0, "%s %s to_f32: %zu mismatches, first %04zx -> %08x want %08x", isa_name(isa),
                  kv_dtype_name(dt), bad, first, f32_bits(back[first]), f32_bits(all_want[first]));
        }
    }
    // Spot values of the scalar conversion itself.
    CHECK(fp32_to_fp16(1.f) == 0x3C00 && fp32_to_fp16(65504.f) == 0x7BFF && fp32_to_fp16(65520.f) == 0x7C00,
          "fp16 basics");
    CHECK(fp32_to_fp16(5.9604645e-8f) == 0x0001 && fp32_to_fp16(2.9802322e-8f) == 0 && fp16_to_fp32(0x0001) == 5.9604645e-8f,
          "fp16 subnormals");
    CHECK(fp32_to_fp16(1.f + 1.f / 2048) == 0x3C00 && fp32_to_fp16(1.f + 3.f / 2048) == 0x3C02, "fp16 ties to even");
    CHECK(fp32_to_bf16(1.f) == 0x3F80 && bf16_to_fp32(0x3F80) == 1.f && fp32_to_bf16(f32_from_bits(0x3F808000u)) == 0x3F80 &&
              fp32_to_bf16(f32_from_bits(0x3F818000u)) == 0x3F82,
          "bf16 ties to even");
}

// A KeySource that, like the KV store, makes only the range it was asked for readable: every
// other block of the views points at NaNs, so a kernel reading outside its range changes the
// result. Output and block scores must be bit-identical to the call without a source.
static void test_key_source() {
    const int hd = 64, bt = 16, n_kv = 2, G = 3, n_keys[2] = {1000, 517};
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const size_t block_elems = static_cast<size_t>(bt) * hd;
    std::vector<std::vector<uint16_t>> k_data(n_kv), v_data(n_kv);
    std::vector<std::vector<const void*>> k_real(n_kv), v_real(n_kv), k_view(n_kv), v_view(n_kv);
    const std::vector<uint16_t> nan_block(block_elems, 0x7E00);
    for (int h = 0; h < n_kv; ++h) {
        const int nb = (n_keys[h] + bt - 1) / bt;
        k_data[h].resize(nb * block_elems);
        v_data[h].resize(nb * block_elems);
        for (size_t i = 0; i < k_data[h].size(); ++i) {
            k_data[h][i] = fp32_to_fp16(u(rng));
            v_data[h][i] = fp32_to_fp16(u(rng));
        }
        for (int b = 0; b < nb; ++b) {
            k_real[h].push_back(k_data[h].data() + b * block_elems);
            v_real[h].push_back(v_data[h].data() + b * block_elems);
        }
    }
    struct Source final : KeySource {
        std::vector<std::vector<const void*>>*k_real, *v_real, *k_view, *v_view;
        const void* nan = nullptr;
        const int* n_keys = nullptr;
        int calls = 0, bad = 0;
        void prepare(int head, int key_begin, int key_end) override {
            ++calls;
            if (head < 0 || head >= 2 || key_begin < 0 || key_begin > key_end || key_end > n_keys[head] ||
                key_begin % 16) {
                ++bad;
                return;
            }
            for (int h = 0; h < 2; ++h)
                for (size_t b = 0; b < (*k_view)[h].size(); ++b) {
                    const bool in = h == head && static_cast<int>(b) * 16 < key_end && static_cast<int>(b + 1) * 16 > key_begin;
                    (*k_view)[h][b] = in ? (*k_real)[h][b] : nan;
                    (*v_view)[h][b] = in ? (*v_real)[h][b] : nan;
                }
        }
    };
    ThreadPool pool(2);
    for (Isa isa : available_isas()) {
        for (int n_q : {1, 2, 40, 300}) {
            KvHeadView views[2];
            AttentionProblem p;
            p.n_kv_heads = n_kv;
            p.group = G;
            p.head_dim = hd;
            p.block_tokens = bt;
            p.dtype = KvDtype::F16;
            p.n_q = n_q;
            std::vector<float> q(static_cast<size_t>(n_q) * n_kv * G * hd), out_a(q.size()), out_b(q.size());
            for (float& x : q) x = u(rng);
            const size_t stride = (n_keys[0] + bt - 1) / bt;
            std::vector<float> scores_a(n_kv * stride, 0.f), scores_b(scores_a.size(), 0.f);
            p.q = q.data();
            p.scores_stride = stride;
            p.heads = views;
            AttentionWorkspace ws;
            for (int h = 0; h < n_kv; ++h) {
                views[h].k_blocks = k_real[h].data();
                views[h].v_blocks = v_real[h].data();
                views[h].n_keys = n_keys[h];
            }
            p.out = out_a.data();
            p.block_scores = scores_a.data();
            attention(p, isa, &pool, ws);
            for (int h = 0; h < n_kv; ++h) {
                k_view[h].assign(k_real[h].size(), nan_block.data());
                v_view[h].assign(v_real[h].size(), nan_block.data());
                views[h].k_blocks = k_view[h].data();
                views[h].v_blocks = v_view[h].data();
            }
            Source source;
            source.k_real = &k_real;
            source.v_real = &v_real;
            source.k_view = &k_view;
            source.v_view = &v_view;
            source.nan = nan_block.data();
            source.n_keys = n_keys;
            p.out = out_b.data();
            p.block_scores = scores_b.data();
            attention(p, isa, &pool, ws, &source);
            CHECK(source.calls >= n_kv && source.bad == 0, "%s n_q=%d: %d prepare calls, %d malformed", isa_name(isa), n_q,
                  source.calls, source.bad);
            CHECK(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)) == 0,
                  "%s n_q=%d: output differs with a key source", isa_name(isa), n_q);
            CHECK(std::memcmp(scores_a.data(), scores_b.data(), scores_a.size() * sizeof(float)) == 0,
                  "%s n_q=%d: block scores differ with a key source", isa_name(isa), n_q);
        }
    }
}

// The observation window's second score output: the masses of the last W queries alone, equal
// to a float64 reference on every ISA, in the decoded (few queries) and tiled (many) paths, with
// and without threads; the block scores are bit-identical with and without it.
static void test_window_scores() {
    std::mt19937 rng(11);
    ThreadPool pool(2);
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8}) {
        KvCacheConfig cfg;
        cfg.n_layers = 1;
        cfg.n_kv_heads = 2;
        cfg.head_dim = 64;
        cfg.n_heads = 6;
        cfg.dtype = dt;
        cfg.block_tokens = 16;
        cfg.max_tokens = 1024;
        cfg.threads = 1;
        KvCache cache(cfg);
        const int G = 3, hd = 64, n_keys = 700, mb = cache.max_blocks();
        auto k = random_vec(rng, static_cast<size_t>(n_keys) * 2 * hd), v = random_vec(rng, k.size());
        cache.append(0, k.data(), v.data(), n_keys);
        std::vector<float> kh[2], vh[2];
        for (int h = 0; h < 2; ++h) {
            kh[h].resize(static_cast<size_t>(n_keys) * hd);
            vh[h].resize(kh[h].size());
            cache.read(0, h, kh[h].data(), vh[h].data());
        }
        KvHeadView views[2] = {cache.view(0, 0), cache.view(0, 1)};
        for (int n_q : {1, 2, 8, 37, 130}) {
            auto q = random_vec(rng, static_cast<size_t>(n_q) * 6 * hd, 2.f);
            const std::vector<float> seen = queries_seen(dt, q, n_q, hd);
            for (int w : {1, 5, n_q}) {
                if (w > n_q) continue;
                std::vector<double> ref(2 * static_cast<size_t>(mb), 0.0);
                for (int h = 0; h < 2; ++h)
                    for (int t = n_q - w; t < n_q; ++t)
                        for (int g = 0; g < G; ++g) {
                            const float* qr = &seen[(static_cast<size_t>(t) * 6 + h * G + g) * hd];
                            const int visible = n_keys - n_q + t + 1;
                            std::vector<double> sc(visible);
                            double m = -INFINITY, l = 0;
                            for (int j = 0; j < visible; ++j) {
                                double dot = 0;
                                for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * kh[h][j * hd + d];
                                m = std::max(m, sc[j] = dot / 8.0);
                            }
                            for (double& x : sc) l += (x = std::exp(x - m));
                            for (int j = 0; j < visible; ++j) ref[h * mb + j / 16] += sc[j] / l;
                        }
                std::vector<float> scalar_window;
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
                        std::vector<float> out(q.size()), plain(2 * static_cast<size_t>(mb), 0.f), scores(plain),
                            window(plain);
                        p.out = out.data();
                        p.block_scores = plain.data();
                        p.scores_stride = mb;
                        AttentionWorkspace ws;
                        attention(p, isa, tp, ws);
                        p.block_scores = scores.data();
                        p.window_scores = window.data();
                        p.window_queries = w;
                        attention(p, isa, tp, ws);
                        const std::string what = std::string(isa_name(isa)) + " " + kv_dtype_name(dt) +
                                                 " n_q=" + std::to_string(n_q) + " w=" + std::to_string(w) +
                                                 (tp ? " threads" : "");
                        CHECK(std::memcmp(plain.data(), scores.data(), plain.size() * sizeof(float)) == 0,
                              "%s: block scores change with a window", what.c_str());
                        const double e = rel_err(window, ref);
                        CHECK(e < 2e-5, "%s: window rel err %.3g vs float64", what.c_str(), e);
                        if (isa == Isa::Scalar && !tp) scalar_window = window;
                        else CHECK(rel_err(window, scalar_window) < 1e-5, "%s: window differs from scalar", what.c_str());
                        if (w == n_q) CHECK(rel_err(window, scores) < 1e-6, "%s: a window of all queries is the block scores", what.c_str());
                    }
                }
            }
        }
    }
    AttentionProblem p;  // a window without block scores, or of no query, is malformed
    AttentionWorkspace ws;
    KvHeadView view;
    const void* blocks[1] = {nullptr};
    view.k_blocks = view.v_blocks = blocks;
    view.n_keys = 1;
    std::vector<float> q(16), out(16), window(1);
    p.n_kv_heads = p.group = p.n_q = 1;
    p.head_dim = p.block_tokens = 16;
    p.heads = &view;
    p.q = q.data();
    p.out = out.data();
    p.window_scores = window.data();
    p.window_queries = 1;
    p.scores_stride = 1;
    CHECK(throws<std::invalid_argument>([&] { attention(p, Isa::Scalar, nullptr, ws); }), "window needs block scores");
    p.block_scores = window.data();
    p.window_queries = 2;
    CHECK(throws<std::invalid_argument>([&] { attention(p, Isa::Scalar, nullptr, ws); }), "window_queries > n_q");
}

// Sliding-window layers (KvCache::windows): every ISA against the float64 reference and the
// scalar kernels, through decode and prefill tiles, with windows shorter than, equal to and
// longer than a block; the layer gives its leading blocks back as the window moves on.
static void test_sliding_window() {
    std::mt19937 rng(77);
    struct WindowCase {
        int n_kv, group, hd, bt, window;
        KvDtype dtype;
        std::vector<int> chunks;
        int threads;
    };
    const std::vector<WindowCase> cases = {
        {1, 4, 256, 16, 37, KvDtype::F16, {70, 1}, 1},      {1, 4, 256, 16, 37, KvDtype::Q8, {70, 33}, 1},
        {2, 2, 64, 16, 16, KvDtype::Q8, {100, 50, 1}, 2},   {1, 1, 64, 64, 5, KvDtype::F16, {3, 70}, 1},
        {1, 4, 128, 64, 300, KvDtype::Q8, {512, 97}, 2},    {2, 3, 64, 32, 200, KvDtype::F32, {150, 130, 1}, 2},
        {1, 4, 256, 16, 512, KvDtype::Q8, {600, 1}, 2},     {1, 8, 64, 128, 70, KvDtype::BF16, {260, 64}, 1},
    };
    for (const WindowCase& c : cases) {
        KvCacheConfig cfg = two_layer_config(c.n_kv, c.group, c.hd, c.bt, c.dtype, c.threads);
        cfg.windows = {c.window, 0};
        KvCache cache(cfg);
        const int row = cfg.n_heads * c.hd, kv_row = c.n_kv * c.hd;
        char what[160];
        std::snprintf(what, sizeof what, "%s kv=%d g=%d hd=%d bt=%d window=%d threads=%d last chunk=%d",
                      kv_dtype_name(c.dtype), c.n_kv, c.group, c.hd, c.bt, c.window, c.threads, c.chunks.back());
        int written = 0;
        for (size_t i = 0; i < c.chunks.size(); ++i) {
            const int n = c.chunks[i];
            auto q = random_vec(rng, static_cast<size_t>(n) * row, 2.f);
            auto k = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
            auto v = random_vec(rng, static_cast<size_t>(n) * kv_row, 1.f);
            if (i + 1 < c.chunks.size()) {
                std::vector<float> out(static_cast<size_t>(n) * row);
                cache.step(0, q.data(), k.data(), v.data(), n, out.data());
                cache.step(1, q.data(), k.data(), v.data(), n, out.data());
                written += n;
                continue;
            }
            cache.append(0, k.data(), v.data(), n);
            written += n;
            // What an append keeps: the window's newest window - 1 tokens before it, less than a
            // block more, and the appended ones.
            const int before = written - n;
            const int need = std::min(before, c.window - 1);
            for (int h = 0; h < c.n_kv; ++h) {
                const int held = cache.length(0, h) - n;
                CHECK(held >= need && held < need + c.bt, "%s: holds %d tokens before the chunk, want [%d, %d)", what,
                      held, need, need + c.bt);
            }
            CHECK(cache.eviction_stats().layers[0].counters.tokens_seen == written, "%s: tokens_seen", what);
            const Reference ref = reference(cache, 0, q, n);
            std::vector<float> scalar_out;
            for (Isa isa : available_isas()) {
                std::vector<float> out(static_cast<size_t>(n) * row, NAN);
                cache.attend(0, q.data(), n, out.data(), nullptr, 0, isa);
                const double e = rel_err(out, ref.out), tol = attention_tolerance(isa, c.dtype, n);
                CHECK(e < tol, "%s %s: output rel err %.3g vs float64", isa_name(isa), what, e);
                if (isa == Isa::Scalar) scalar_out = out;
                else {
                    const double es = rel_err(out, scalar_out);
                    CHECK(es < (tol > 2e-5 ? tol : 1e-5), "%s %s: rel err %.3g vs scalar", isa_name(isa), what, es);
                }
            }
        }
        // The global layer kept everything; the window layer's bytes are its blocks alone.
        CHECK(cache.length(1, 0) == written - c.chunks.back(), "%s: the global layer holds %d", what, cache.length(1, 0));
        const size_t block_bytes = kv_row_bytes(c.dtype, c.hd) * c.bt;
        const EvictionStats st = cache.eviction_stats();
        const size_t want_blocks = static_cast<size_t>((cache.length(0, 0) + c.bt - 1) / c.bt) * 2 * c.n_kv;
        CHECK(st.layers[0].bytes_held <= want_blocks * ((block_bytes + 63) / 64 * 64), "%s: window layer holds %zu bytes",
              what, st.layers[0].bytes_held);
    }
    // Scores are refused over a window layer, and so is an evict() plan; eviction acts on the
    // global layers only (test_eviction_budgets.cpp), and a range of window layers is refused.
    KvCacheConfig cfg;
    cfg.n_layers = 2;
    cfg.n_kv_heads = 1;
    cfg.head_dim = 64;
    cfg.n_heads = 2;
    cfg.windows = {8, 0};
    KvCache cache(cfg);
    auto x = random_vec(rng, 4 * 128, 1.f);
    std::vector<float> out(4 * 128), scores(cache.max_blocks() * 1, 0.f);
    cache.append(0, x.data(), x.data(), 4);
    CHECK(throws<std::invalid_argument>([&] { cache.attend(0, x.data(), 1, out.data(), scores.data(), cache.max_blocks()); }),
          "scores over a window layer");
    CHECK(throws<std::invalid_argument>([&] { cache.evict(0, 0, {{0, 4}}); }), "evict() on a window layer");
    EvictionConfig ev;
    ev.layer_end = 1;
    CHECK(throws<std::invalid_argument>([&] { cache.enable_eviction(ev); }), "eviction over window layers only");
    ev.layer_end = -1;
    cache.enable_eviction(ev);  // the global layer alone
    CHECK(!cache.eviction_state()->collects(0) && cache.eviction_state()->collects(1), "collects the global layer");
    cfg.windows = {8};
    CHECK(throws<std::invalid_argument>([&] { KvCache bad(cfg); }), "windows of the wrong length");
    cfg.windows = {-1, 0};
    CHECK(throws<std::invalid_argument>([&] { KvCache bad(cfg); }), "a negative window");
}

int main() {
    std::printf("best isa: %s\n", isa_name(best_isa()));
    test_window_scores();
    test_sliding_window();
    test_conversions();
    test_against_reference();
    test_chunked_prefill();
    test_uneven_heads();
    test_key_source();
    test_errors();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all attention tests passed\n");
    return 0;
}
