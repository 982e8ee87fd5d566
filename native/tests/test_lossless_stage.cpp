// One file: one ctest program for the store; its cases share the configs and reference runs.
// The lossless store: attention outputs bit-identical to the raw cache in every mode (with H2O
// evicting, per-head budgets on and off, sync and async, cache budgets from none to all), the
// pool really released in store mode, re-encoding on eviction, dissolving on truncate, deferral with a full
// queue, every injected fault ending raw/valid with its reason counted, reset and destruction
// with jobs under way.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/cache/kv_dtype.h"

#include "test_support.h"

using namespace mnn_h2o;

namespace {

constexpr int kLayers = 4, kKv = 2, kHd = 64, kHeads = 4, kBt = 16;

KvCacheConfig cache_config(int threads = 1, KvDtype dtype = KvDtype::F16) {
    KvCacheConfig c;
    c.n_layers = kLayers;
    c.n_kv_heads = kKv;
    c.head_dim = kHd;
    c.n_heads = kHeads;
    c.dtype = dtype;
    c.block_tokens = kBt;
    c.max_tokens = 2048;
    c.threads = threads;
    return c;
}

EvictionConfig eviction_config(bool per_head) {
    EvictionConfig h;
    h.sink_tokens = 16;
    h.recent_tokens = 48;
    h.target_lossy_ratio = 0.0;
    h.target_keep_ratio = 0.6;
    h.layer_start = 2;
    h.layer_end = -1;
    h.trigger_min_tokens = 96;
    h.update_interval = 8;
    h.per_head_budget = per_head;
    return h;
}

StoreConfig store_config(StoreMode mode, int async_threads = 0) {
    StoreConfig s;
    s.mode = mode;
    s.scope = StoreScope::FrontNAndKept;
    s.front_n = 2;
    s.hot_sink_tokens = 16;
    s.hot_recent_tokens = 32;
    s.chunk_tokens = 32;
    s.v_dedup_layers = 0;
    s.async_threads = async_threads;
    s.max_queue = 64;
    s.decode_cache_bytes = 64 << 10;
    s.prefetch = async_threads > 0;
    s.probe_every = 3;
    return s;
}

// Values on a coarse grid (multiples of 1/2 up to 3.5, times power-of-two channel scales, like
// real K's outlier channels): every f16 low byte is zero, so the frames shrink with RLE alone
// too (the aarch64 run under qemu has no libzstd).
std::vector<float> kv_rows(std::mt19937& rng, int n) {
    std::vector<float> x = random_vec(rng, static_cast<size_t>(n) * kKv * kHd);
    for (size_t i = 0; i < x.size(); ++i) {
        const float grid = std::max(-3.5f, std::min(3.5f, std::round(x[i] * 2.f) / 2.f));
        x[i] = std::ldexp(grid, static_cast<int>(i % kHd % 4) - 2);
    }
    return x;
}

// Prefill in two chunks (the second attends over chunks the first left), then decode steps; all
// attention outputs appended to *outs. Every call gets the same inputs whatever the cache. With
// a vocabulary, layer 0's V rows are those of a random token id of it, as in a real model.
void run(KvCache& cache, uint32_t seed, int decode_steps, std::vector<float>* outs, bool drain_each_step = false,
         int vocab = 0) {
    std::mt19937 rng(seed);
    std::mt19937 vocab_rng(seed + 1);
    const std::vector<float> token_v = kv_rows(vocab_rng, std::max(vocab, 1));  // [token][kv head][hd]
    const auto forward = [&](int n, bool prefill) {
        for (int layer = 0; layer < kLayers; ++layer) {
            const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * kHeads * kHd, 2.f);
            const std::vector<float> k = kv_rows(rng, n);
            std::vector<float> v = kv_rows(rng, n);
            const size_t token_floats = static_cast<size_t>(kKv) * kHd;
            for (int t = 0; t < n && layer == 0 && vocab > 0; ++t)
                std::memcpy(v.data() + t * token_floats, token_v.data() + rng() % vocab * token_floats,
                            token_floats * sizeof(float));
            std::vector<float> out(static_cast<size_t>(n) * kHeads * kHd);
            cache.step(layer, q.data(), k.data(), v.data(), n, out.data());
            outs->insert(outs->end(), out.begin(), out.end());
        }
        cache.end_step(n, prefill);
        if (drain_each_step) cache.drain_store();
    };
    forward(200, true);
    forward(90, true);
    for (int s = 0; s < decode_steps; ++s) forward(1, false);
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_kv(const KvCache& a, const KvCache& b) {
    for (int layer = 0; layer < kLayers; ++layer)
        for (int h = 0; h < kKv; ++h) {
            const int n = a.length(layer, h);
            if (n != b.length(layer, h)) return false;
            std::vector<float> ka(static_cast<size_t>(n) * kHd), va(ka.size()), kb(ka.size()), vb(ka.size());
            a.read(layer, h, ka.data(), va.data());
            b.read(layer, h, kb.data(), vb.data());
            if (!same_bytes(ka, kb) || !same_bytes(va, vb)) return false;
        }
    return true;
}

// Both caches go on with the same further steps; true if every attention output is the same.
bool same_next_outputs(KvCache& a, KvCache& b) {
    std::vector<float> oa, ob;
    run(a, 6, 4, &oa);
    run(b, 6, 4, &ob);
    return same_bytes(oa, ob);
}

struct Reference {
    std::vector<float> outs;
    size_t pool_bytes = 0;
};

Reference reference(bool per_head, int threads, int decode_steps) {
    KvCache cache(cache_config(threads));
    cache.enable_eviction(eviction_config(per_head));
    Reference r;
    run(cache, 7, decode_steps, &r.outs);
    r.pool_bytes = cache.pool_bytes_held();
    return r;
}

int64_t fallbacks(const StoreStats& s, StoreFallback reason) { return s.total.fallbacks[static_cast<int>(reason)]; }

}  // namespace

// Store vs off, bit for bit: sync and async (free-running and drained every step), cache
// budgets from none to all, H2O budgets per head or shared, one or two attention threads.
static void test_store_bit_identical() {
    struct Case {
        bool per_head;
        int threads, async;
        size_t budget;
        bool drained;
        int chunk_tokens = 32;
    };
    const Case cases[] = {{false, 1, 0, 0, false},          {false, 1, 0, size_t{64} << 20, false},
                          {false, 2, 2, size_t{64} << 10, false}, {false, 1, 2, 0, true},
                          {true, 1, 2, 0, true},            {true, 2, 0, size_t{64} << 10, false},
                          {false, 2, 2, 0, true, 64}};
    for (const Case& c : cases) {
        KvCache raw(cache_config(c.threads));
        raw.enable_eviction(eviction_config(c.per_head));
        std::vector<float> want;
        run(raw, 7, 40, &want);
        KvCache cache(cache_config(c.threads));
        cache.enable_eviction(eviction_config(c.per_head));
        StoreConfig sc = store_config(StoreMode::Store, c.async);
        sc.decode_cache_bytes = c.budget;
        sc.chunk_tokens = c.chunk_tokens;
        cache.enable_store(sc);
        std::vector<float> outs;
        run(cache, 7, 40, &outs, c.drained);
        cache.drain_store();
        const StoreStats st = cache.store_stats();
        const std::string what = "per_head " + std::to_string(c.per_head) + " threads " + std::to_string(c.threads) +
                                 " async " + std::to_string(c.async) + " budget " + std::to_string(c.budget) +
                                 " chunk " + std::to_string(c.chunk_tokens);
        const bool deterministic = c.async == 0 || c.drained;  // free-running jobs land whenever they finish
        CHECK(same_bytes(outs, want), "%s: outputs differ from the raw cache", what.c_str());
        CHECK(same_kv(cache, raw), "%s: read() differs", what.c_str());
        CHECK(st.total.chunks_stored > 0 && st.chunks_held > 0, "%s: nothing stored", what.c_str());
        if (deterministic && !c.per_head) CHECK(st.total.repacked > 0, "%s: eviction re-encoded no chunk", what.c_str());
        CHECK(st.total.cache_misses > 0, "%s: no chunk was ever decoded for attention", what.c_str());
        if (c.budget == 0) CHECK(st.cache_bytes == 0 && st.total.cache_hits == 0, "%s: cache used", what.c_str());
        if (c.budget > (size_t{1} << 20)) CHECK(st.total.cache_hits > 0, "%s: big cache never hit", what.c_str());
        CHECK(cache.pool_bytes_held() < raw.pool_bytes_held(), "%s: pool %zu not below raw %zu", what.c_str(),
              cache.pool_bytes_held(), raw.pool_bytes_held());
        CHECK(st.layers[0].chunks_held > 0 && st.layers[2].chunks_held > 0, "%s: scope", what.c_str());
        CHECK(st.lossless_ratio > 1.0, "%s: ratio %.3f", what.c_str(), st.lossless_ratio);
        if (c.async) CHECK(st.queue_peak > 0, "%s: no job queued", what.c_str());
    }
}

// Layer 1 is outside the scope {0, 1 < front_n=1} (scope front_n: not H2O's layers).
static void test_scope() {
    KvCache cache(cache_config());
    cache.enable_eviction(eviction_config(false));
    StoreConfig sc = store_config(StoreMode::Store);
    sc.front_n = 1;
    sc.scope = StoreScope::FrontN;
    cache.enable_store(sc);
    std::vector<float> outs;
    run(cache, 3, 10, &outs);
    const StoreStats st = cache.store_stats();
    CHECK(st.layers[0].chunks_held > 0, "layer 0 in scope holds no chunk");
    for (int layer = 1; layer < kLayers; ++layer)
        CHECK(st.layers[layer].counters.chunks_encoded == 0, "layer %d out of scope was encoded", layer);
}

// Full mode: every cold chunk verified, nothing changes; probe mode: a sample.
static void test_full_and_probe() {
    const Reference ref = reference(false, 1, 30);
    for (StoreMode mode : {StoreMode::Full, StoreMode::Probe}) {
        for (int async : {0, 2}) {
            KvCache cache(cache_config());
            cache.enable_eviction(eviction_config(false));
            cache.enable_store(store_config(mode, async));
            std::vector<float> outs;
            run(cache, 7, 30, &outs, true);
            const StoreStats st = cache.store_stats();
            const char* name = store_mode_name(mode);
            CHECK(same_bytes(outs, ref.outs), "%s async %d: outputs differ", name, async);
            CHECK(st.total.chunks_encoded > 0 && st.total.chunks_stored == 0 && st.chunks_held == 0,
                  "%s: encoded %lld stored %lld", name, static_cast<long long>(st.total.chunks_encoded),
                  static_cast<long long>(st.total.chunks_stored));
            CHECK(st.total.verify_mismatches == 0, "%s: %lld mismatches", name, static_cast<long long>(st.total.verify_mismatches));
            CHECK(cache.pool_bytes_held() == ref.pool_bytes, "%s: the KV changed size", name);
            CHECK(st.lossless_ratio > 1.0 && st.total.raw_bytes > st.total.compressed_bytes, "%s: ratio %.3f", name,
                  st.lossless_ratio);
            if (mode == StoreMode::Full) {
                KvCache probe(cache_config());
                probe.enable_eviction(eviction_config(false));
                probe.enable_store(store_config(StoreMode::Probe, async));
                std::vector<float> o;
                run(probe, 7, 30, &o, true);
                const int64_t full = st.total.chunks_encoded, sampled = probe.store_stats().total.chunks_encoded;
                CHECK(sampled > 0 && sampled < full, "probe encoded %lld of full's %lld", static_cast<long long>(sampled),
                      static_cast<long long>(full));
            }
        }
    }
}

// Store mode holds less: the pool shrinks by the stored blocks, frames are smaller than them.
static void test_accounting() {
    const Reference ref = reference(false, 1, 20);
    KvCache cache(cache_config());
    cache.enable_eviction(eviction_config(false));
    StoreConfig sc = store_config(StoreMode::Store, 1);
    sc.decode_cache_bytes = 0;
    cache.enable_store(sc);
    std::vector<float> outs;
    run(cache, 7, 20, &outs);
    cache.drain_store();
    const StoreStats st = cache.store_stats();
    const size_t block_bytes = size_t{kBt} * kHd * 2;
    const size_t stored_blocks = static_cast<size_t>(st.total.stored_raw_bytes) / block_bytes;
    CHECK(st.pool_bytes == cache.pool_bytes_held() && st.bytes_held == cache.bytes_held(), "stats vs getters");
    CHECK(st.bytes_held == st.pool_bytes + st.blob_bytes + st.cache_bytes + st.scratch_bytes, "held = sum of parts");
    CHECK(st.pool_bytes + st.blob_bytes < ref.pool_bytes, "pool %zu + frames %zu not below raw %zu", st.pool_bytes,
          st.blob_bytes, ref.pool_bytes);
    CHECK(ref.pool_bytes - cache.pool_bytes_held() >= stored_blocks * block_bytes - 2 * kLayers * kKv * 4 * block_bytes,
          "pool dropped %zu for %zu stored blocks", ref.pool_bytes - cache.pool_bytes_held(), stored_blocks);
    CHECK(st.blob_bytes < static_cast<size_t>(st.total.stored_raw_bytes), "frames not smaller than raw");
    CHECK(st.total_ratio == static_cast<double>(st.bytes_uncompressed) / static_cast<double>(st.bytes_held),
          "total ratio %.3f", st.total_ratio);
    CHECK(cache.eviction_stats().bytes_held == cache.pool_bytes_held(), "eviction_stats bytes_held is the pool's");
    std::printf("accounting: raw %zu B, store %zu B held (pool %zu, frames %zu, scratch %zu), ratio %.3f lossless, "
                "%.3f total\n",
                ref.pool_bytes, st.bytes_held, st.pool_bytes, st.blob_bytes, st.scratch_bytes, st.lossless_ratio,
                st.total_ratio);
}

// Explicit plans: a non-aligned one dissolves the whole head, truncate through a chunk.
static void test_explicit_evict_and_truncate() {
    KvCache raw(cache_config()), cache(cache_config());
    cache.enable_store(store_config(StoreMode::Store));
    std::vector<float> a, b;
    run(raw, 5, 4, &a);
    run(cache, 5, 4, &b);
    CHECK(cache.store_stats().layers[0].chunks_held > 0, "no chunk in layer 0");
    const std::vector<TokenRun> plan{{0, 37}, {100, 150}, {260, 34}};  // not block-aligned
    raw.evict(0, 1, plan);
    cache.evict(0, 1, plan);
    const std::vector<TokenRun> aligned{{0, 48}, {80, raw.length(1, 0) - 80}};
    raw.evict(1, 0, aligned);
    cache.evict(1, 0, aligned);
    raw.truncate(0, 0, 101);
    cache.truncate(0, 0, 101);
    CHECK(same_kv(raw, cache), "KV differs after evict/truncate");
    CHECK(same_next_outputs(raw, cache), "outputs differ after evict/truncate");
    CHECK(cache.store_stats().total.dissolved > 0, "nothing dissolved");
}

// max_queue 1: one job in flight at a time, the rest deferred and picked up later.
static void test_deferral() {
    const Reference ref = reference(false, 1, 40);
    KvCache cache(cache_config());
    cache.enable_eviction(eviction_config(false));
    StoreConfig sc = store_config(StoreMode::Store, 1);
    sc.max_queue = 1;
    cache.enable_store(sc);
    std::vector<float> outs;
    run(cache, 7, 40, &outs);
    cache.drain_store();
    const StoreStats st = cache.store_stats();
    CHECK(same_bytes(outs, ref.outs), "outputs differ with deferrals");
    CHECK(st.deferrals > 0 && st.queue_peak == 1, "deferrals %lld, queue peak %d", static_cast<long long>(st.deferrals),
          st.queue_peak);
    CHECK(st.total.chunks_stored > 0, "deferred chunks never stored");
}

// Every fault: outputs unchanged, the fallback counted under its reason.
static void test_faults() {
    const Reference ref = reference(false, 1, 40);
    struct Case {
        const char* name;
        StoreFaults faults;
        StoreFallback reason;
    };
    StoreFaults encode, verify, alloc, worker;
    encode.encode_error = true;
    verify.verify_mismatch = true;
    alloc.alloc_failure = true;
    worker.worker_exception = true;
    const Case cases[] = {{"encode_error", encode, StoreFallback::EncodeError},
                          {"verify_mismatch", verify, StoreFallback::VerifyMismatch},
                          {"alloc_failure", alloc, StoreFallback::AllocFailure},
                          {"worker_exception", worker, StoreFallback::WorkerException}};
    for (const Case& c : cases) {
        for (int async : {0, 2}) {
            KvCache cache(cache_config());
            cache.enable_eviction(eviction_config(false));
            StoreConfig sc = store_config(StoreMode::Store, async);
            sc.faults = c.faults;
            cache.enable_store(sc);
            std::vector<float> outs;
            run(cache, 7, 40, &outs, true);  // chunks in place before evictions reach them
            const StoreStats st = cache.store_stats();
            CHECK(same_bytes(outs, ref.outs), "%s async %d: outputs differ", c.name, async);
            CHECK(fallbacks(st, c.reason) > 0, "%s async %d: fallback not counted", c.name, async);
            if (c.reason != StoreFallback::AllocFailure)
                CHECK(st.chunks_held == 0 && cache.pool_bytes_held() == ref.pool_bytes, "%s: something was stored", c.name);
            else
                CHECK(st.total.dissolved == 0 && st.total.repacked == 0 && st.chunks_held > 0,
                      "%s: re-encoded or dissolved despite the fault", c.name);
        }
    }
    // A chunk that does not compress stays raw and is not tried again: random bit patterns in f32.
    KvCache noise(cache_config(1, KvDtype::F32));
    StoreConfig sc = store_config(StoreMode::Store);
    noise.enable_store(sc);
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint32_t> bits;
    std::vector<float> k(static_cast<size_t>(160) * kKv * kHd), v(k.size());
    for (auto* x : {&k, &v})
        for (float& f : *x) {
            const uint32_t u = bits(rng);
            std::memcpy(&f, &u, 4);
        }
    noise.append(0, k.data(), v.data(), 160);
    noise.end_step(1, true);
    const int64_t first = fallbacks(noise.store_stats(), StoreFallback::Incompressible);
    noise.end_step(1, true);
    CHECK(first > 0 && fallbacks(noise.store_stats(), StoreFallback::Incompressible) == first,
          "incompressible chunks: %lld, then %lld (retried)", static_cast<long long>(first),
          static_cast<long long>(fallbacks(noise.store_stats(), StoreFallback::Incompressible)));
}

// reset() gives everything back; destruction with jobs under way does not hang or leak (ASan).
static void test_reset_and_teardown() {
    KvCache cache(cache_config());
    cache.enable_eviction(eviction_config(false));
    StoreConfig sc = store_config(StoreMode::Store, 2);
    cache.enable_store(sc);
    std::vector<float> outs;
    run(cache, 9, 10, &outs);
    cache.reset();
    const StoreStats st = cache.store_stats();
    CHECK(cache.bytes_held() == 0 && cache.pool_bytes_held() == 0 && st.chunks_held == 0 && st.total.chunks_encoded == 0,
          "reset left %zu bytes", cache.bytes_held());
    CHECK(cache.store_config() && cache.store_config()->mode == StoreMode::Store, "store off after reset");
    outs.clear();
    run(cache, 9, 10, &outs);  // usable again, same results as a fresh cache
    KvCache fresh(cache_config());
    fresh.enable_eviction(eviction_config(false));
    std::vector<float> want;
    run(fresh, 9, 10, &want);
    CHECK(same_bytes(outs, want), "outputs after reset differ");
    for (int i = 0; i < 3; ++i) {
        KvCache doomed(cache_config());
        StoreConfig busy = store_config(StoreMode::Store, 2);
        busy.max_queue = 256;
        doomed.enable_store(busy);
        std::vector<float> o;
        run(doomed, 11, 0, &o);  // jobs queued by end_step, never drained
    }
}

// enable_store names bad fields; disabling or replacing the config dissolves everything.
static void test_enable_disable() {
    KvCache cache(cache_config());
    const auto rejects = [&](const char* field, void (*edit)(StoreConfig&)) {
        StoreConfig sc = store_config(StoreMode::Store);
        edit(sc);
        try {
            cache.enable_store(sc);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what()).find(field) != std::string::npos;
        }
        return false;
    };
    CHECK(rejects("chunk_tokens", [](StoreConfig& s) { s.chunk_tokens = 24; }), "chunk_tokens");
    CHECK(rejects("front_n", [](StoreConfig& s) { s.front_n = 5; }), "front_n");
    CHECK(rejects("max_queue", [](StoreConfig& s) { s.max_queue = 0; }), "max_queue");
    CHECK(rejects("probe_every", [](StoreConfig& s) { s.probe_every = 0; }), "probe_every");
    CHECK(rejects("hot_recent_tokens", [](StoreConfig& s) { s.hot_recent_tokens = -1; }), "hot_recent_tokens");
    CHECK(rejects("async_threads", [](StoreConfig& s) { s.async_threads = schema::lossless::async_threads::kHi + 1; }),
          "async_threads: the schema's bound");
    CHECK(rejects("chunk_tokens", [](StoreConfig& s) { s.chunk_tokens = schema::lossless::chunk_tokens::kHi + 16; }),
          "chunk_tokens: the schema's bound");
    CHECK(rejects("scope", [](StoreConfig& s) { s.scope = static_cast<StoreScope>(7); }), "scope");
    CHECK(!cache.store_config(), "a rejected config was enabled");

    KvCache raw(cache_config());
    cache.enable_store(store_config(StoreMode::Store, 1));
    std::vector<float> a, b;
    run(raw, 4, 8, &a);
    run(cache, 4, 8, &b);
    cache.drain_store();
    CHECK(cache.store_stats().chunks_held > 0, "nothing stored");
    cache.enable_store(store_config(StoreMode::Full));  // replaces: dissolves first
    CHECK(cache.store_stats().chunks_held == 0 && cache.pool_bytes_held() == raw.pool_bytes_held(), "replace");
    cache.enable_store(store_config(StoreMode::Store));
    cache.end_step(1, true);
    CHECK(cache.store_stats().chunks_held > 0, "nothing stored again");
    cache.disable_store();
    CHECK(!cache.store_config() && cache.bytes_held() == raw.bytes_held() && same_kv(raw, cache), "disable");
}

// Layer 0 of both caches gets the same `tokens` random rows (seed `seed`), then head `head` is cut
// to `keep` tokens (heads of different lengths) and the step ends as a prefill would.
static void prefill_alike(KvCache& a, KvCache& b, uint32_t seed, int tokens, int head, int keep) {
    for (KvCache* c : {&a, &b}) {
        std::mt19937 rng(seed);
        const std::vector<float> k = kv_rows(rng, tokens), v = kv_rows(rng, tokens);
        c->append(0, k.data(), v.data(), tokens);
        c->truncate(0, head, keep);
        c->end_step(1, true);
    }
}

// The store path gives the same bits as the raw cache with every ISA, prefill rows included, and
// with two threads over heads of different lengths (where split_keys keeps the decode split of
// the all-heads call).
static void test_isas_and_splits() {
    for (Isa isa : {Isa::Scalar, best_isa()}) {
        KvCache raw(cache_config(2)), cache(cache_config(2));
        cache.enable_store(store_config(StoreMode::Store));
        prefill_alike(raw, cache, 8, 1100, 1, 700);
        CHECK(cache.store_stats().layers[0].chunks_held > 0, "nothing stored");
        for (int n : {1, 3, 40}) {
            std::mt19937 rng(static_cast<uint32_t>(n));
            const std::vector<float> q = random_vec(rng, static_cast<size_t>(n) * kHeads * kHd);
            std::vector<float> o1(q.size()), o2(q.size()), s1(kKv * 128, 0.f), s2(kKv * 128, 0.f);
            raw.attend(0, q.data(), n, o1.data(), s1.data(), 128, isa);
            cache.attend(0, q.data(), n, o2.data(), s2.data(), 128, isa);
            CHECK(same_bytes(o1, o2) && same_bytes(s1, s2), "%s n_q %d: differs", isa_name(isa), n);
        }
    }
}

// Decode batches of at most 512 KiB. Head 0 holds 8 chunks of 32 KB, head 1 30. The first batch
// takes head 0 and, as lookahead, head 1's first 8 chunks; head 1's range then finds those in
// scratch, moves them to the front and decodes its other 22 chunks behind them, over the place
// they were (so wrong offsets would show). Every chunk is decoded exactly once per step, and the
// outputs stay bit-identical, with one thread (a range per head) and two (a range per split).
static void test_decode_batches() {
    for (int threads : {1, 2}) {
        KvCacheConfig c = cache_config(threads);
        c.n_layers = 1;
        c.max_tokens = 4096;
        KvCache raw(c), cache(c);
        StoreConfig sc = store_config(StoreMode::Store);
        sc.front_n = 1;
        sc.chunk_tokens = 128;
        sc.decode_cache_bytes = 0;
        cache.enable_store(sc);
        prefill_alike(raw, cache, 11, 4000, 0, 1072);
        const StoreStats before = cache.store_stats();
        const int64_t chunks = before.layers[0].chunks_held;
        CHECK(chunks == 38, "%lld chunks stored, expected 8 + 30", static_cast<long long>(chunks));
        std::mt19937 rng(12);
        for (int step = 0; step < 3; ++step) {
            const std::vector<float> k = kv_rows(rng, 1), v = kv_rows(rng, 1);
            const std::vector<float> q = random_vec(rng, kHeads * kHd);
            std::vector<float> o1(q.size()), o2(q.size());
            raw.step(0, q.data(), k.data(), v.data(), 1, o1.data());
            cache.step(0, q.data(), k.data(), v.data(), 1, o2.data());
            CHECK(same_bytes(o1, o2), "threads %d step %d: the batched decode changed the output", threads, step);
        }
        const StoreStats after = cache.store_stats();
        const int64_t decodes = after.total.cache_misses - before.total.cache_misses;
        const int64_t batches = after.total.decode_batches - before.total.decode_batches;
        CHECK(decodes == 3 * chunks, "threads %d: %lld chunk decodes over 3 steps of %lld chunks", threads,
              static_cast<long long>(decodes), static_cast<long long>(chunks));
        CHECK(threads == 2 || batches == 3 * 2, "%lld decode batches over 3 steps, expected 2 per step",
              static_cast<long long>(batches));
    }
}

// Rough cost of the attention path's decode: a cache too small to hold anything.
static void measure_decode() {
    KvCacheConfig c = cache_config();
    c.n_layers = 1;
    c.block_tokens = 16;
    KvCache cache(c);
    StoreConfig sc = store_config(StoreMode::Store);
    sc.front_n = 1;
    sc.chunk_tokens = 128;
    sc.decode_cache_bytes = 0;
    cache.enable_store(sc);
    std::mt19937 rng(2);
    const std::vector<float> k = kv_rows(rng, 1024), v = kv_rows(rng, 1024);
    cache.append(0, k.data(), v.data(), 1024);
    cache.end_step(1, true);
    const std::vector<float> q = random_vec(rng, kHeads * kHd);
    std::vector<float> out(q.size());
    for (int i = 0; i < 20; ++i) cache.attend(0, q.data(), 1, out.data());
    const StoreStats st = cache.store_stats();
    const double per_chunk = st.total.decode_us / static_cast<double>(st.total.cache_misses);
    std::printf("decode path: %.1f us per 128-token chunk (K+V, 2x128x64 f16), ratio %.3f\n", per_chunk,
                st.lossless_ratio);
}

// V dedup layers hold each distinct V row once: layer 0's rows come from a 40-token vocabulary,
// layer 1's never repeat. Outputs and read() stay bit-identical with H2O evicting there too
// (re-encoding keeps the references), through the decode cache and prefetches, truncation
// compacts the tables, and a table that cannot grow leaves the chunk raw.
static void test_v_dedup() {
    for (int async : {0, 2}) {
        for (size_t budget : {size_t{0}, size_t{64} << 20}) {
            EvictionConfig h = eviction_config(false);
            h.layer_start = 0;
            KvCache raw(cache_config()), cache(cache_config());
            raw.enable_eviction(h);
            cache.enable_eviction(h);
            StoreConfig sc = store_config(StoreMode::Store, async);
            sc.v_dedup_layers = 2;
            sc.decode_cache_bytes = budget;
            cache.enable_store(sc);
            std::vector<float> want, outs;
            run(raw, 9, 60, &want, false, 40);
            run(cache, 9, 60, &outs, async > 0, 40);
            cache.drain_store();
            const StoreStats st = cache.store_stats();
            const std::string what = "async " + std::to_string(async) + " budget " + std::to_string(budget);
            CHECK(same_bytes(outs, want), "%s: outputs differ from the raw cache", what.c_str());
            CHECK(same_kv(cache, raw), "%s: read() differs", what.c_str());
            CHECK(st.layers[0].chunks_held > 0 && st.layers[0].table_bytes > 0 && st.layers[2].table_bytes == 0,
                  "%s: tables %zu / %zu", what.c_str(), st.layers[0].table_bytes, st.layers[2].table_bytes);
            // 40 distinct rows per head fit one page: far below layer 0's V at raw size.
            const size_t v0_raw = static_cast<size_t>(raw.length(0, 0) + raw.length(0, 1)) * kHd * 2;
            CHECK(st.layers[0].table_bytes < v0_raw / 2, "%s: layer 0 table %zu for V of %zu", what.c_str(),
                  st.layers[0].table_bytes, v0_raw);
            CHECK(st.total.repacked > 0 && st.layers[0].counters.repacked > 0, "%s: no dedup chunk re-encoded", what.c_str());
            CHECK(st.bytes_held == st.pool_bytes + st.blob_bytes + st.table_bytes + st.cache_bytes + st.scratch_bytes,
                  "%s: held = sum of parts", what.c_str());
            if (budget > 0) CHECK(st.total.cache_hits > 0, "%s: cache never hit", what.c_str());
            if (async == 0) {
                // To the sink block, which no chunk holds: a survivor chunk of an earlier eviction
                // may end within any longer prefix and keep its rows in the table.
                for (int head = 0; head < kKv; ++head) {
                    raw.truncate(1, head, 16);
                    cache.truncate(1, head, 16);
                }
                CHECK(cache.store_stats().layers[1].table_bytes == 0, "%s: layer 1 table %zu after truncation",
                      what.c_str(), cache.store_stats().layers[1].table_bytes);
                CHECK(same_kv(cache, raw), "%s: read() differs after truncation", what.c_str());
            }
        }
    }
    KvCache raw(cache_config()), cache(cache_config());
    StoreConfig sc = store_config(StoreMode::Store);
    sc.v_dedup_layers = 1;
    sc.faults.alloc_failure = true;
    cache.enable_store(sc);
    std::vector<float> want, outs;
    run(raw, 9, 10, &want, false, 40);
    run(cache, 9, 10, &outs, false, 40);
    const StoreStats st = cache.store_stats();
    CHECK(same_bytes(outs, want) && same_kv(cache, raw), "alloc failure: values differ");
    CHECK(st.layers[0].chunks_held == 0 && st.layers[1].chunks_held > 0 && fallbacks(st, StoreFallback::AllocFailure) > 0,
          "alloc failure: layer 0 holds %lld chunks", static_cast<long long>(st.layers[0].chunks_held));
}

// The quantised dtypes (q8 the default): every mode runs over their rows (codes and scales as
// Gear's Q8 / Q4 frames), with attention outputs and read() bit-identical to the same cache
// without the store; store mode holds the chunks compressed (V deduplicated in layer 0), with
// H2O evicting meanwhile, and re-encodes and dissolves them under explicit plans.
static void test_quantised_dtypes() {
    for (KvDtype dtype : {KvDtype::Q8, KvDtype::Q8R, KvDtype::Q4, KvDtype::Q4R}) {
        KvCache raw(cache_config(1, dtype));
        raw.enable_eviction(eviction_config(false));
        std::vector<float> want;
        run(raw, 7, 40, &want, false, 40);
        const size_t block_bytes = kv_row_bytes(dtype, kHd) * kBt;
        for (StoreMode mode : {StoreMode::Store, StoreMode::Full, StoreMode::Probe}) {
            for (int async : {0, 2}) {
                if (async && dtype != KvDtype::Q8) continue;  // the threads are dtype-blind
                KvCache cache(cache_config(1, dtype));
                cache.enable_eviction(eviction_config(false));
                StoreConfig sc = store_config(mode, async);
                sc.v_dedup_layers = 1;
                sc.chunk_tokens = 64;
                cache.enable_store(sc);
                std::vector<float> outs;
                run(cache, 7, 40, &outs, async > 0, 40);
                cache.drain_store();
                const StoreStats st = cache.store_stats();
                const std::string what = std::string(kv_dtype_name(dtype)) + " " + store_mode_name(mode) + " async " +
                                         std::to_string(async);
                CHECK(same_bytes(outs, want), "%s: outputs differ from the cache without the store", what.c_str());
                CHECK(same_kv(cache, raw), "%s: read() differs", what.c_str());
                CHECK(st.total.chunks_encoded > 0 && st.total.verify_mismatches == 0, "%s: encoded %lld, mismatches %lld",
                      what.c_str(), static_cast<long long>(st.total.chunks_encoded),
                      static_cast<long long>(st.total.verify_mismatches));
                CHECK(st.lossless_ratio > 1.0, "%s: ratio %.3f", what.c_str(), st.lossless_ratio);
                CHECK(st.total.raw_bytes % static_cast<int64_t>(block_bytes) == 0, "%s: raw bytes %lld not whole %zu-byte blocks",
                      what.c_str(), static_cast<long long>(st.total.raw_bytes), block_bytes);
                if (mode == StoreMode::Store) {
                    CHECK(st.chunks_held > 0 && st.layers[0].table_bytes > 0, "%s: held %lld chunks, table %zu",
                          what.c_str(), static_cast<long long>(st.chunks_held), st.layers[0].table_bytes);
                    CHECK(cache.pool_bytes_held() < raw.pool_bytes_held(), "%s: pool not below the raw cache's", what.c_str());
                } else {
                    CHECK(st.chunks_held == 0 && cache.pool_bytes_held() == raw.pool_bytes_held(), "%s: the KV changed",
                          what.c_str());
                }
                if (mode != StoreMode::Store || async) continue;
                std::printf("%s store: lossless ratio %.3f\n", kv_dtype_name(dtype), st.lossless_ratio);
                // Chunks trimmed by an aligned plan are re-encoded, one cut by truncate()
                // dissolved: the rows stay those of the cache without the store.
                KvCache plain(cache_config(1, dtype));
                std::vector<float> ignored;
                plain.enable_eviction(eviction_config(false));
                run(plain, 7, 40, &ignored, false, 40);
                const std::vector<TokenRun> plan{{0, 48}, {80, 32}, {144, plain.length(1, 0) - 144}};
                plain.evict(1, 0, plan);
                cache.evict(1, 0, plan);
                plain.truncate(1, 1, 101);
                cache.truncate(1, 1, 101);
                const StoreStats after = cache.store_stats();
                // (The rotated rows of this data trimmed to two blocks do not compress: dissolved.)
                const bool repacks = !kv_dtype_rotated(dtype);
                CHECK((after.layers[1].counters.repacked > 0) == repacks && after.layers[1].counters.dissolved > 0,
                      "%s: repacked %lld, dissolved %lld", what.c_str(),
                      static_cast<long long>(after.layers[1].counters.repacked),
                      static_cast<long long>(after.layers[1].counters.dissolved));
                CHECK(same_kv(cache, plain), "%s: read() differs after evict/truncate", what.c_str());
                CHECK(same_next_outputs(plain, cache), "%s: outputs differ after evict/truncate", what.c_str());
            }
        }
    }
}

// Two neighbouring chunks trimmed to half by one plan become one frame.
static void test_merge_neighbours() {
    KvCache raw(cache_config()), cache(cache_config());
    StoreConfig sc = store_config(StoreMode::Store);
    sc.chunk_tokens = 64;  // chunks of blocks 1-4, 5-8, 9-12 in layer 0
    cache.enable_store(sc);
    std::vector<float> a, b;
    run(raw, 5, 4, &a);
    run(cache, 5, 4, &b);
    const int64_t chunks = cache.store_stats().layers[0].chunks_held;
    // Blocks 3-4 and 7-8 go: the first two chunks keep two blocks each and meet.
    const std::vector<TokenRun> plan{{0, 48}, {80, 32}, {144, raw.length(0, 0) - 144}};
    raw.evict(0, 0, plan);
    cache.evict(0, 0, plan);
    const StoreStats st = cache.store_stats();
    CHECK(st.layers[0].counters.repacked >= 2 && st.layers[0].counters.merged == 1 && st.layers[0].chunks_held == chunks - 1,
          "repacked %lld, merged %lld, chunks %lld -> %lld", static_cast<long long>(st.layers[0].counters.repacked),
          static_cast<long long>(st.layers[0].counters.merged), static_cast<long long>(chunks),
          static_cast<long long>(st.layers[0].chunks_held));
    CHECK(same_kv(raw, cache), "KV differs after merging");
    CHECK(same_next_outputs(raw, cache), "outputs differ after merging");
}

int main() {
    test_store_bit_identical();
    test_scope();
    test_full_and_probe();
    test_accounting();
    test_explicit_evict_and_truncate();
    test_merge_neighbours();
    test_quantised_dtypes();
    test_deferral();
    test_faults();
    test_v_dedup();
    test_reset_and_teardown();
    test_enable_disable();
    test_isas_and_splits();
    test_decode_batches();
    measure_decode();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all kv store tests passed\n");
    return 0;
}
