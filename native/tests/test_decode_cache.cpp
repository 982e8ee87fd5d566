// The decode cache, apart from attention (test_lossless_stage.cpp runs attention over it): read()
// returns a compressed block's true bytes with and without entries; prefetch fills entries
// within the budget and a settled prefetch gives back its room; a forgotten chunk's entry goes.
#include <memory>
#include <random>
#include <vector>

#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/store/decode_cache.h"

#include "store_test_support.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::store;
using namespace store_test;

namespace {

// One layer, one kv head of n blocks, installed as chunks of two blocks.
struct Fixture {
    Fixture(int n, StoreConfig cfg)
        : config(cfg),
          codec(config, cache_config()),
          pool(codec.block_bytes()),
          heads(1),
          own(codec.options()),
          stats(1),
          table(cache_config(), config, codec, pool, heads, own, stats, [this](Chunk& c) { cache.forget(c); }),
          cache(config, codec, table, jobs, own, stats),
          jobs(config, codec, [this](Job& job, bool failed) { cache.prefetched(job, failed); }) {
        std::mt19937 rng(17);
        KvHeadBlocks& kv = heads[0];
        for (int b = 0; b < n; ++b)
            for (auto* list : {&kv.k_blocks, &kv.v_blocks}) {
                list->push_back(pool.allocate());
                original.push_back(kv_bytes(rng, codec.block_bytes()));
                std::memcpy(list->back(), original.back().data(), codec.block_bytes());
            }
        kv.length = n * kBt;
        table.head(0, 0).state.assign(static_cast<size_t>(n), kRaw);
        for (int first = 0; first + 2 <= n; first += 2) {
            std::vector<uint8_t> raw;
            for (int list = 0; list < 2; ++list)
                for (int b = first; b < first + 2; ++b) raw.insert(raw.end(), original[2 * b + list].begin(), original[2 * b + list].end());
            table.install(0, 0, first, 2, frame_of(codec, raw, 2), false, raw.data());
        }
    }
    bool reads_back(int n) {
        for (int b = 0; b < n; ++b) {
            const void *k = nullptr, *v = nullptr;
            cache.read_block(0, 0, b, &k, &v);
            if (std::memcmp(k, original[2 * b].data(), codec.block_bytes()) != 0 ||
                std::memcmp(v, original[2 * b + 1].data(), codec.block_bytes()) != 0)
                return false;
        }
        return true;
    }

    StoreConfig config;
    ChunkCodec codec;
    BlockPool pool;
    std::vector<KvHeadBlocks> heads;
    EncodeBuffers own;
    std::vector<StoreLayerStats> stats;
    ChunkTable table;
    DecodeCache cache;
    StoreJobs jobs;  // last: its workers are joined first
    std::vector<std::vector<uint8_t>> original;  // K, V of each block
};

}  // namespace

static void test_read_without_entries() {
    Fixture f(6, store_config());
    CHECK(f.table.head(0, 0).chunks.size() == 3, "chunks");
    CHECK(f.reads_back(6), "read() bytes differ");
    CHECK(f.cache.entry_bytes() == 0 && f.cache.scratch_bytes() == f.codec.raw_bytes(2), "one chunk's read buffer");
    CHECK(throws<std::logic_error>([&] {
              const void *k, *v;
              f.cache.read_block(0, 0, 7, &k, &v);
          }),
          "a raw block read as compressed");
    f.cache.reset();
    CHECK(f.cache.scratch_bytes() == 0, "reset kept scratch");
}

static void test_prefetch_within_budget() {
    StoreConfig cfg = store_config();
    cfg.async_threads = 1;
    cfg.prefetch = true;
    cfg.decode_cache_bytes = 2 * (size_t{2} * 2 * kBt * kHd * 2);  // two of the three chunks
    Fixture f(6, cfg);
    f.cache.prefetch(0);
    CHECK(f.cache.entry_bytes() == cfg.decode_cache_bytes, "reserved %zu", f.cache.entry_bytes());
    f.jobs.drain();
    int entries = 0;
    for (const auto& c : f.table.head(0, 0).chunks) entries += c->decoded != nullptr;
    CHECK(entries == 2 && f.cache.entry_bytes() == cfg.decode_cache_bytes, "%d entries", entries);
    CHECK(f.reads_back(6), "read() through entries differs");
    Chunk& first = *f.table.head(0, 0).chunks[0];
    f.cache.forget(first);
    CHECK(!first.decoded && f.cache.entry_bytes() == cfg.decode_cache_bytes / 2, "forgotten entry");
    f.cache.prefetch(1);  // a layer the cache does not have: nothing
    f.cache.prefetch(0);  // the forgotten chunk's room back
    // Settling cancels the prefetch if no worker has started it, and gives its room back.
    f.cache.settle_prefetches();
    entries = 0;
    for (const auto& c : f.table.head(0, 0).chunks) entries += c->decoded != nullptr;
    CHECK(f.cache.entry_bytes() == entries * cfg.decode_cache_bytes / 2, "%d entries, %zu bytes", entries,
          f.cache.entry_bytes());
    CHECK(f.reads_back(6), "read() after refilling differs");
}

int main() {
    test_read_without_entries();
    test_prefetch_within_budget();
    std::printf("%s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
