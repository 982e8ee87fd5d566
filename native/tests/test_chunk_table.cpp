// The chunk table: an installed frame gives the head's blocks back to the pool; a compaction
// re-encodes trimmed chunks and merges trimmed neighbours; truncating and dissolving give raw
// blocks with the exact bytes back; the alloc fault keeps a chunk compressed and valid; every
// changed or dropped chunk is forgotten by the decode cache first.
#include <memory>
#include <random>
#include <vector>

#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/store/chunk_table.h"

#include "store_test_support.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::store;
using namespace store_test;

namespace {

// One layer, one kv head of n raw blocks, and a table over it.
struct Fixture {
    explicit Fixture(int n, StoreConfig cfg = store_config())
        : config(cfg),
          codec(config, cache_config()),
          pool(codec.block_bytes()),
          heads(1),
          own(codec.options()),
          stats(1),
          table(cache_config(), config, codec, pool, heads, own, stats, [this](Chunk&) { ++forgotten; }) {
        std::mt19937 rng(13);
        KvHeadBlocks& kv = heads[0];
        for (int b = 0; b < n; ++b) {
            for (auto* list : {&kv.k_blocks, &kv.v_blocks}) {
                list->push_back(pool.allocate());
                const std::vector<uint8_t> bytes = kv_bytes(rng, codec.block_bytes());
                std::memcpy(list->back(), bytes.data(), bytes.size());
                original.push_back(bytes);
            }
        }
        kv.length = n * kBt;
        table.head(0, 0).state.assign(static_cast<size_t>(n), kRaw);
    }
    // K then V of blocks [first, first + n) as the head holds them now.
    std::vector<uint8_t> raw(int first, int n) const {
        std::vector<uint8_t> out;
        for (int list = 0; list < 2; ++list)
            for (int b = first; b < first + n; ++b) {
                const uint8_t* p = static_cast<const uint8_t*>(list ? heads[0].v_blocks[b] : heads[0].k_blocks[b]);
                out.insert(out.end(), p, p + codec.block_bytes());
            }
        return out;
    }
    bool install(int first, int n) {
        const std::vector<uint8_t> bytes = raw(first, n);
        return table.install(0, 0, first, n, frame_of(codec, bytes, n), false, bytes.data());
    }
    // Block b's K (list 0) or V (list 1) has its original bytes.
    bool intact(int b, int list, int original_block) const {
        const void* p = list ? heads[0].v_blocks[b] : heads[0].k_blocks[b];
        return p && std::memcmp(p, original[2 * original_block + list].data(), codec.block_bytes()) == 0;
    }

    StoreConfig config;
    ChunkCodec codec;
    BlockPool pool;
    std::vector<KvHeadBlocks> heads;
    EncodeBuffers own;
    std::vector<StoreLayerStats> stats;
    int forgotten = 0;
    ChunkTable table;
    std::vector<std::vector<uint8_t>> original;  // K, V of each block as written
};

}  // namespace

static void test_install_and_dissolve() {
    Fixture f(4);
    const size_t pool_before = f.pool.bytes_held();
    CHECK(f.install(0, 2), "install");
    CHECK(f.table.holds_compressed(0) && f.table.blob_bytes() > 0, "held");
    CHECK(!f.heads[0].k_blocks[0] && !f.heads[0].v_blocks[1], "blocks still in the lists");
    CHECK(f.pool.bytes_held() == pool_before - 4 * f.codec.block_bytes(), "pool not released");
    CHECK(f.table.head(0, 0).state[0] == kStored && f.table.head(0, 0).state[2] == kRaw, "states");
    CHECK(f.stats[0].chunks_stored == 1, "counted");
    f.table.dissolve_all();
    CHECK(!f.table.holds_compressed(0) && f.table.blob_bytes() == 0 && f.forgotten == 1, "dissolved");
    for (int b = 0; b < 4; ++b) CHECK(f.intact(b, 0, b) && f.intact(b, 1, b), "block %d differs", b);
    CHECK(f.pool.bytes_held() == pool_before && f.stats[0].dissolved == 1, "pool after dissolving");
}

// Plans keeping blocks 0, 2, 3 of 4: the chunk [0, 2) loses block 1 and is re-encoded, then it
// and the chunk [2, 4), now neighbours with 3 live blocks, do not fit one 2-block chunk.
static void test_compact_repacks() {
    Fixture f(4);
    CHECK(f.install(0, 2) && f.install(2, 2), "install");
    f.table.compact(0, 0, {{0, kBt}, {2 * kBt, 2 * kBt}}, true);
    // The cache drops the evicted block from its lists after the store has followed the plan.
    f.heads[0].k_blocks.erase(f.heads[0].k_blocks.begin() + 1);
    f.heads[0].v_blocks.erase(f.heads[0].v_blocks.begin() + 1);
    const HeadChunks& hc = f.table.head(0, 0);
    CHECK(hc.chunks.size() == 2 && hc.state.size() == 3, "%zu chunks, %zu states", hc.chunks.size(), hc.state.size());
    CHECK(f.stats[0].repacked == 1 && f.stats[0].merged == 0, "repacked %lld", (long long)f.stats[0].repacked);
    CHECK(hc.chunks[0]->n_blocks == 1 && hc.chunks[1]->first == 1, "positions after compaction");
    f.table.dissolve_all();
    CHECK(f.intact(0, 0, 0) && f.intact(1, 1, 2) && f.intact(2, 0, 3), "bytes after compaction");
}

// Two single-block chunks side by side fit one chunk: a compaction keeping everything merges them.
static void test_merge() {
    Fixture f(2);
    CHECK(f.install(0, 1) && f.install(1, 1), "install");
    f.table.compact(0, 0, {{0, 2 * kBt}}, true);
    CHECK(f.table.head(0, 0).chunks.size() == 1 && f.stats[0].merged == 1, "merged %lld", (long long)f.stats[0].merged);
    f.table.dissolve_all();
    CHECK(f.intact(0, 0, 0) && f.intact(1, 1, 1), "bytes after merging");
}

static void test_truncate() {
    Fixture f(4);
    CHECK(f.install(0, 2) && f.install(2, 2), "install");
    f.table.truncate(0, 0, kBt + 1);  // block 1 gets appended to: chunk [0, 2) must be raw
    CHECK(!f.table.holds_compressed(0) && f.table.head(0, 0).state.size() == 2, "truncated");
    CHECK(f.intact(0, 0, 0) && f.intact(1, 1, 1), "bytes after truncating");
}

static void test_alloc_fault() {
    StoreConfig cfg = store_config();
    cfg.faults.alloc_failure = true;
    Fixture f(2, cfg);
    CHECK(f.install(0, 2), "install");
    CHECK(throws<std::bad_alloc>([&] { f.table.dissolve_all(); }), "dissolving without memory");
    CHECK(f.table.holds_compressed(0) && f.stats[0].fallbacks[static_cast<int>(StoreFallback::AllocFailure)] == 1,
          "the chunk stays compressed");
    f.table.reset();
    CHECK(!f.table.holds_compressed(0) && f.table.blob_bytes() == 0, "reset");
}

int main() {
    test_install_and_dissolve();
    test_compact_repacks();
    test_merge();
    test_truncate();
    test_alloc_fault();
    std::printf("%s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
