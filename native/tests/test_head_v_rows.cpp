// A head's V row table: repeated rows are held once and come back exactly, references are 2
// bytes while the table is small, compaction keeps only referenced rows (renumbering the
// references), and the injected faults leave the chunk uninstallable with the reason given.
#include <memory>
#include <random>
#include <vector>

#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/store/head_v_rows.h"

#include "store_test_support.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::store;
using namespace store_test;

namespace {

// A chunk of n_blocks whose frame is a stand-in (the table reads only what follows it).
std::unique_ptr<Chunk> chunk_of(int n_blocks) {
    auto c = std::make_unique<Chunk>();
    c->n_blocks = n_blocks;
    c->blob.assign(40, 0xAB);
    c->frame_size = c->blob.size();
    for (int j = 0; j < n_blocks; ++j) c->live.push_back(j);
    return c;
}

std::vector<uint8_t> gathered_v(const ChunkCodec& codec, const Chunk& c) {
    std::vector<uint8_t> out(codec.raw_bytes(c.n_blocks));
    codec.gather_v(c, out.data());
    return std::vector<uint8_t>(out.begin() + static_cast<std::ptrdiff_t>(out.size() / 2), out.end());
}

}  // namespace

static void test_intern_and_gather() {
    const ChunkCodec codec(store_config(), cache_config());
    HeadVRows rows(codec.row_bytes(), kBt, StoreFaults{});
    CHECK(rows.bytes() == 0 && rows.rows() == 0, "a table before the first chunk");
    std::mt19937 rng(4);
    const std::vector<uint8_t> v = kv_bytes(rng, codec.raw_bytes(2) / 2, codec.row_bytes(), 3);
    auto c = chunk_of(2);
    CHECK(!rows.add_refs(*c, v.data()), "add_refs failed");
    CHECK(rows.rows() == 3, "%zu rows for 3 distinct", rows.rows());
    CHECK(c->ref_width == 2 && c->blob.size() == 40 + 2 * kBt * 2, "width %d blob %zu", c->ref_width, c->blob.size());
    CHECK(c->blob.capacity() == c->blob.size(), "the blob holds more than it needs");
    CHECK(rows.bytes() > 0, "table bytes not counted");
    CHECK(gathered_v(codec, *c) == v, "gathered rows differ");
    rows.clear();
    CHECK(rows.bytes() == 0 && rows.rows() == 0, "clear kept rows");
}

static void test_compact() {
    const ChunkCodec codec(store_config(), cache_config());
    HeadVRows rows(codec.row_bytes(), kBt, StoreFaults{});
    std::mt19937 rng(5);
    std::vector<std::unique_ptr<Chunk>> chunks;
    std::vector<std::vector<uint8_t>> vs;
    for (int i = 0; i < 2; ++i) {
        vs.push_back(kv_bytes(rng, codec.raw_bytes(1) / 2, codec.row_bytes(), 4));
        chunks.push_back(chunk_of(1));
        CHECK(!rows.add_refs(*chunks.back(), vs.back().data()), "add_refs failed");
    }
    CHECK(rows.rows() == 8, "%zu rows", rows.rows());
    rows.compact(chunks);  // nothing dropped: unchanged
    CHECK(rows.rows() == 8, "compacted without drops");
    rows.drop(kBt);
    chunks.erase(chunks.begin());
    rows.compact(chunks);
    CHECK(rows.rows() == 4, "%zu rows after the first chunk went", rows.rows());
    CHECK(gathered_v(codec, *chunks[0]) == vs[1], "renumbered rows differ");
}

static void test_faults() {
    const ChunkCodec codec(store_config(), cache_config());
    std::mt19937 rng(6);
    const std::vector<uint8_t> v = kv_bytes(rng, codec.raw_bytes(1) / 2);
    StoreFaults alloc;
    alloc.alloc_failure = true;
    HeadVRows no_memory(codec.row_bytes(), kBt, alloc);
    auto c = chunk_of(1);
    const auto r = no_memory.add_refs(*c, v.data());
    CHECK(r && *r == StoreFallback::AllocFailure && c->ref_width == 0 && c->blob.size() == 40, "alloc fault");
    StoreFaults verify;
    verify.verify_mismatch = true;
    HeadVRows mismatching(codec.row_bytes(), kBt, verify);
    const auto m = mismatching.add_refs(*chunk_of(1), v.data());
    CHECK(m && *m == StoreFallback::VerifyMismatch, "verify fault");
}

int main() {
    test_intern_and_gather();
    test_compact();
    test_faults();
    std::printf("%s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
