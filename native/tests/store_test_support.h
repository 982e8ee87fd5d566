// Scaffolding of the store parts' tests (test_chunk_codec.cpp, test_head_v_rows.cpp, ...): a
// small f16 cache geometry, compressible KV bytes, and frames made with the chunk codec.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mnn_h2o/store/chunk_codec.h"
#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/store/store_config.h"

namespace store_test {

constexpr int kHd = 32, kBt = 16;

inline mnn_h2o::KvCacheConfig cache_config(int layers = 1, int kv_heads = 1) {
    mnn_h2o::KvCacheConfig c;
    c.n_layers = layers;
    c.n_kv_heads = kv_heads;
    c.head_dim = kHd;
    c.n_heads = kv_heads;
    c.dtype = mnn_h2o::KvDtype::F16;
    c.block_tokens = kBt;
    c.max_tokens = 1024;
    c.threads = 1;
    return c;
}

inline mnn_h2o::StoreConfig store_config() {
    mnn_h2o::StoreConfig s;
    s.mode = mnn_h2o::StoreMode::Store;
    s.scope = mnn_h2o::StoreScope::FrontN;
    s.front_n = 0;
    s.hot_sink_tokens = 64;
    s.hot_recent_tokens = 256;
    s.chunk_tokens = 2 * kBt;
    s.v_dedup_layers = 0;
    s.async_threads = 0;
    s.decode_cache_bytes = 0;
    s.prefetch = false;
    return s;
}

// n bytes of f16 values drawn from a few halves (every row repeats one of `distinct` rows when
// row_bytes is given): they compress with RLE alone, like the aarch64 run without libzstd.
inline std::vector<uint8_t> kv_bytes(std::mt19937& rng, size_t n, size_t row_bytes = 0, int distinct = 0) {
    static const uint16_t halves[] = {0x3C00, 0x3800, 0xBC00, 0x4000, 0x0000, 0xB800};
    std::vector<uint8_t> out(n);
    std::uniform_int_distribution<int> pick(0, 5);
    for (size_t i = 0; i + 1 < n; i += 2) {
        const uint16_t h = halves[pick(rng)];
        std::memcpy(out.data() + i, &h, 2);
    }
    if (row_bytes && distinct > 0)
        for (size_t r = distinct; r < n / row_bytes; ++r)
            std::memcpy(out.data() + r * row_bytes, out.data() + (r % distinct) * row_bytes, row_bytes);
    return out;
}

// A checked frame of raw (K then V of n_blocks blocks; k_only: K alone, the first half).
inline std::vector<uint8_t> frame_of(const mnn_h2o::store::ChunkCodec& codec, const std::vector<uint8_t>& raw,
                                     int n_blocks, bool k_only = false) {
    auto b = codec.buffers();
    b->raw = raw;
    const mnn_h2o::store::Encoded e = codec.encode_checked(*b, n_blocks, k_only);
    if (!e.encoded || !e.verified) return {};
    return std::vector<uint8_t>(b->frame.begin(), b->frame.begin() + static_cast<std::ptrdiff_t>(e.size));
}

}  // namespace store_test
