// The chunk codec: frames of K and V (or K alone), of every dtype, decode back bit for bit, a dedup chunk's V rows
// come from its table, the injected encode and verify faults act, and a damaged frame is refused.
#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "mnn_h2o/cache/kv_dtype.h"
#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/store/head_v_rows.h"

#include "store_test_support.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::store;
using namespace store_test;

static void test_round_trip() {
    const ChunkCodec codec(store_config(), cache_config());
    CHECK(codec.block_bytes() == kBt * kHd * 2, "block bytes %zu", codec.block_bytes());
    CHECK(codec.raw_bytes(3) == 6 * codec.block_bytes(), "raw bytes");
    std::mt19937 rng(1);
    const std::vector<uint8_t> raw = kv_bytes(rng, codec.raw_bytes(2));
    auto b = codec.buffers();
    b->raw = raw;
    const Encoded e = codec.encode_checked(*b, 2, false);
    CHECK(e.encoded && e.verified, "encoded %d verified %d", e.encoded, e.verified);
    CHECK(e.size > 0 && e.size < raw.size(), "frame %zu of %zu", e.size, raw.size());
    Chunk c;
    c.n_blocks = 2;
    c.blob.assign(b->frame.begin(), b->frame.begin() + static_cast<std::ptrdiff_t>(e.size));
    c.frame_size = e.size;
    std::vector<uint8_t> out(raw.size());
    codec.decode(c, out.data(), *b->codec);
    CHECK(out == raw, "decoded bytes differ");
    c.blob[c.frame_size / 2] ^= 0x5a;
    CHECK(!codec.decode_frame(c, out.data(), *b->codec), "a damaged frame decoded");
    CHECK(throws<std::runtime_error>([&] { codec.decode(c, out.data(), *b->codec); }), "no throw");
}

static void test_k_only_with_rows() {
    const ChunkCodec codec(store_config(), cache_config());
    std::mt19937 rng(2);
    std::vector<uint8_t> raw = kv_bytes(rng, codec.raw_bytes(2));
    const size_t half = raw.size() / 2;
    const std::vector<uint8_t> v = kv_bytes(rng, half, codec.row_bytes(), 5);
    std::copy(v.begin(), v.end(), raw.begin() + static_cast<std::ptrdiff_t>(half));
    Chunk c;
    c.n_blocks = 2;
    c.blob = frame_of(codec, raw, 2, true);
    c.frame_size = c.blob.size();
    CHECK(!c.blob.empty(), "no K frame");
    HeadVRows rows(codec.row_bytes(), kBt, StoreFaults{});
    CHECK(!rows.add_refs(c, raw.data() + half), "add_refs failed");
    std::vector<uint8_t> out(raw.size());
    auto b = codec.buffers();
    codec.decode(c, out.data(), *b->codec);
    CHECK(out == raw, "K frame + V rows differ");
}

static void test_faults() {
    std::mt19937 rng(3);
    StoreConfig s = store_config();
    s.faults.encode_error = true;
    const ChunkCodec failing(s, cache_config());
    auto b = failing.buffers();
    b->raw = kv_bytes(rng, failing.raw_bytes(1));
    CHECK(!failing.encode_checked(*b, 1, false).encoded, "encode_error ignored");
    s.faults.encode_error = false;
    s.faults.verify_mismatch = true;
    const ChunkCodec mismatching(s, cache_config());
    const Encoded e = mismatching.encode_checked(*b, 1, false);
    CHECK(e.encoded && !e.verified, "verify_mismatch ignored");
}

// Every quantised dtype's chunk (its rows as the cache lays them out: codes, then scales) goes
// through the codec and back bit for bit, K and V or K alone.
static void test_quantised_dtypes() {
    std::mt19937 rng(4);
    for (KvDtype dtype : {KvDtype::Q8, KvDtype::Q8R, KvDtype::Q4, KvDtype::Q4R}) {
        KvCacheConfig cc = cache_config();
        cc.dtype = dtype;
        const ChunkCodec codec(store_config(), cc);
        CHECK(codec.row_bytes() == kv_row_bytes(dtype, kHd), "%s: row bytes %zu", kv_dtype_name(dtype), codec.row_bytes());
        // Codes of a few values and scales of a few halves, as real rows: they compress.
        std::vector<uint8_t> raw = kv_bytes(rng, codec.raw_bytes(2));
        for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(raw[i] % 7);
        for (bool k_only : {false, true}) {
            Chunk c;
            c.n_blocks = 2;
            c.blob = frame_of(codec, raw, 2, k_only);
            c.frame_size = c.blob.size();
            CHECK(!c.blob.empty() && c.blob.size() < raw.size() / (k_only ? 2 : 1), "%s: frame of %zu bytes",
                  kv_dtype_name(dtype), c.blob.size());
            std::vector<uint8_t> out(raw.size() / (k_only ? 2 : 1));
            auto b = codec.buffers();
            CHECK(codec.decode_frame(c, out.data(), *b->codec), "%s: no decode", kv_dtype_name(dtype));
            CHECK(std::equal(out.begin(), out.end(), raw.begin()), "%s: decoded bytes differ", kv_dtype_name(dtype));
        }
    }
}

int main() {
    test_round_trip();
    test_k_only_with_rows();
    test_faults();
    test_quantised_dtypes();
    std::printf("%s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
