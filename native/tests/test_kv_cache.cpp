// Block pool and KV cache storage: exact accounting, memory really returned to the OS (RSS),
// neighbours intact when pages are dropped, read-back in every dtype, truncate/reset, the rotated
// types' stored bytes as kv_rows_as_stored gives them.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/cache/kv_cache.h"

#include "test_support.h"

using namespace mnn_h2o;

static void test_pool_accounting() {
    BlockPool pool(8192, 4);
    CHECK(pool.block_bytes() == 8192 && pool.bytes_held() == 0 && pool.bytes_mapped() == 0, "fresh pool");
    // A chain of blocks, each asked for behind the previous one, is contiguous within a slab.
    std::vector<void*> blocks{pool.allocate()};
    for (int i = 1; i < 10; ++i) blocks.push_back(pool.allocate(blocks.back()));
    for (int i = 1; i < 10; ++i)
        if (i % 4) CHECK(static_cast<char*>(blocks[i]) == static_cast<char*>(blocks[i - 1]) + 8192, "block %d not adjacent", i);
    CHECK(pool.bytes_held() == 10 * 8192u, "held %zu", pool.bytes_held());
    CHECK(pool.bytes_mapped() == 3 * 4 * 8192u, "mapped %zu (3 slabs of 4)", pool.bytes_mapped());
    for (void* b : blocks) CHECK(reinterpret_cast<uintptr_t>(b) % 64 == 0, "block alignment");
    // A second chain never takes the first one's room: it starts a slab of its own.
    void* other = pool.allocate();
    CHECK(pool.bytes_mapped() == 4 * 4 * 8192u, "new chain shares a slab");
    // The tail's freed room goes back to the same chain.
    pool.release(blocks[9]);
    void* again = pool.allocate(blocks[8]);
    CHECK(again == blocks[9], "freed tail block not reused by its chain");
    // Freeing a whole slab's blocks unmaps it.
    for (int i = 0; i < 4; ++i) pool.release(blocks[i]);
    CHECK(pool.bytes_held() == 7 * 8192u && pool.bytes_mapped() == 3 * 4 * 8192u, "held %zu mapped %zu",
          pool.bytes_held(), pool.bytes_mapped());
    CHECK(throws<std::invalid_argument>([&] { pool.release(blocks[0]); }), "double release");
    CHECK(throws<std::invalid_argument>([&] { pool.allocate(blocks[0]); }), "allocate after a free block");
    int on_stack = 0;
    CHECK(throws<std::invalid_argument>([&] { pool.release(&on_stack); }), "foreign pointer");
    CHECK(throws<std::invalid_argument>([&] { pool.release(static_cast<char*>(blocks[5]) + 64); }), "interior pointer");
    pool.release(nullptr);
    for (int i = 4; i < 10; ++i) pool.release(blocks[i]);
    pool.release(other);
    CHECK(pool.bytes_held() == 0 && pool.bytes_mapped() == 0, "all returned");
    CHECK(throws<std::invalid_argument>([] { BlockPool p(0); }), "zero block size");
}

// Blocks smaller than a page share pages: dropping the pages of free blocks must never touch a
// neighbour that is still in use.
static void test_pool_subpage_neighbours() {
    BlockPool pool(1000);  // rounded up to 1024: four blocks per 4 KiB page
    CHECK(pool.block_bytes() == 1024, "rounded block size %zu", pool.block_bytes());
    std::vector<uint8_t*> blocks;
    for (int i = 0; i < 600; ++i) {
        blocks.push_back(static_cast<uint8_t*>(pool.allocate(blocks.empty() ? nullptr : blocks.back())));
        std::memset(blocks.back(), i & 0xFF, 1024);
    }
    std::mt19937 rng(3);
    std::vector<bool> live(blocks.size(), true);
    for (int round = 0; round < 400; ++round) {
        const size_t i = rng() % blocks.size();
        if (!live[i]) continue;
        pool.release(blocks[i]);
        live[i] = false;
    }
    size_t n_live = 0, corrupt = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        if (!live[i]) continue;
        ++n_live;
        for (int j = 0; j < 1024; ++j) corrupt += blocks[i][j] != (i & 0xFF);
    }
    CHECK(corrupt == 0, "%zu corrupted bytes in live blocks", corrupt);
    CHECK(pool.bytes_held() == n_live * 1024, "held %zu for %zu live", pool.bytes_held(), n_live);
    // Reused blocks are writable.
    for (size_t i = 1; i < blocks.size(); ++i) {
        // The chain fills slab after slab: block i starts a slab when i is a multiple of its size.
        if (live[i] || !live[i - 1] || i % pool.blocks_per_slab() == 0) continue;
        void* b = pool.allocate(blocks[i - 1]);
        CHECK(b == blocks[i], "freed neighbour not reused");
        std::memset(b, 0xAB, 1024);
    }
}

static KvCacheConfig model_config(KvDtype dtype, int max_tokens) {
    KvCacheConfig c;
    c.n_layers = 30;
    c.n_kv_heads = 3;
    c.head_dim = 64;
    c.n_heads = 9;
    c.dtype = dtype;
    c.block_tokens = 64;
    c.max_tokens = max_tokens;
    c.threads = 1;
    return c;
}

// Filling the cache raises RSS by about its size; truncating and resetting give it back.
static void test_rss_returns() {
    const int tokens = 4096;
    KvCache cache(model_config(KvDtype::F16, tokens));
    const size_t expect = size_t{30} * 3 * 2 * tokens * 64 * 2;  // 47 MB
    std::vector<float> k(static_cast<size_t>(512) * 3 * 64, 0.25f);
    const long rss0 = rss_bytes();
    for (int layer = 0; layer < 30; ++layer)
        for (int t = 0; t < tokens; t += 512) cache.append(layer, k.data(), k.data(), 512);
    const long rss1 = rss_bytes();
    CHECK(cache.bytes_held() == expect, "held %zu want %zu", cache.bytes_held(), expect);
    CHECK(cache.bytes_mapped() == expect, "mapped %zu want %zu (one slab per head's K or V)", cache.bytes_mapped(), expect);
    CHECK(rss1 - rss0 > static_cast<long>(expect) * 9 / 10, "RSS grew %ld for %zu bytes", rss1 - rss0, expect);

    // Truncating every head to a quarter drops the pages of freed blocks (slabs stay mapped while
    // partly used, but RSS follows bytes_held).
    for (int layer = 0; layer < 30; ++layer)
        for (int h = 0; h < 3; ++h) cache.truncate(layer, h, tokens / 4);
    const long rss2 = rss_bytes();
    CHECK(cache.bytes_held() == expect / 4, "held %zu after truncate", cache.bytes_held());
    CHECK(rss1 - rss2 > static_cast<long>(expect) * 6 / 10, "RSS dropped only %ld after truncate", rss1 - rss2);

    cache.reset();
    const long rss3 = rss_bytes();
    CHECK(cache.bytes_held() == 0 && cache.bytes_mapped() == 0, "reset: held %zu mapped %zu", cache.bytes_held(),
          cache.bytes_mapped());
    CHECK(rss1 - rss3 > static_cast<long>(expect) * 9 / 10, "RSS dropped only %ld after reset", rss1 - rss3);
    for (int layer = 0; layer < 30; ++layer) CHECK(cache.length(layer, 0) == 0, "length after reset");
    std::printf("rss: +%ld MB filled, -%ld MB truncated to 1/4, -%ld MB reset\n", (rss1 - rss0) >> 20,
                (rss1 - rss2) >> 20, (rss1 - rss3) >> 20);
}

// read() returns what was appended, rounded to the dtype exactly as fp16.h does.
static void test_read_back() {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.f, 3.f);
    for (KvDtype dt : {KvDtype::F16, KvDtype::BF16, KvDtype::F32}) {
        KvCacheConfig c = kv_config(2, 2, 80, 4, dt, 16, 200, 1);
        KvCache cache(c);
        const int row = 2 * 80;
        std::vector<float> k(static_cast<size_t>(150) * row), v(k.size());
        for (auto& x : k) x = dist(rng);
        for (auto& x : v) x = dist(rng);
        // Appends of odd sizes across block boundaries.
        for (int t0 = 0, n = 1; t0 < 150; t0 += n, n += 6) {
            n = std::min(n, 150 - t0);
            cache.append(1, &k[static_cast<size_t>(t0) * row], &v[static_cast<size_t>(t0) * row], n);
        }
        CHECK(cache.length(1, 0) == 150 && cache.length(1, 1) == 150 && cache.length(0, 0) == 0, "lengths");
        CHECK(cache.bytes_held() == size_t{2} * 2 * 10 * 16 * kv_row_bytes(dt, 80), "held %zu", cache.bytes_held());
        for (int h = 0; h < 2; ++h) {
            std::vector<float> rk(150 * 80), rv(150 * 80);
            cache.read(1, h, rk.data(), rv.data());
            size_t bad = 0;
            for (int t = 0; t < 150; ++t) {
                for (int d = 0; d < 80; ++d) {
                    const float x = k[static_cast<size_t>(t) * row + h * 80 + d], y = v[static_cast<size_t>(t) * row + h * 80 + d];
                    const auto round = [&](float f) {
                        return dt == KvDtype::F16 ? fp16_to_fp32(fp32_to_fp16(f))
                               : dt == KvDtype::BF16 ? bf16_to_fp32(fp32_to_bf16(f)) : f;
                    };
                    bad += rk[t * 80 + d] != round(x) || rv[t * 80 + d] != round(y);
                }
            }
            CHECK(bad == 0, "%s head %d: %zu values differ", kv_dtype_name(dt), h, bad);
        }
        KvHeadView view = cache.view(1, 0);
        CHECK(view.n_keys == 150 && view.k_blocks && view.v_blocks, "view");
        cache.truncate(1, 0, 20);
        CHECK(cache.length(1, 0) == 20 && cache.length(1, 1) == 150, "truncate one head");
        CHECK(throws<std::invalid_argument>([&] { cache.truncate(1, 0, 21); }), "truncate beyond length");
    }
}

// What a rotated cache stores (on the ISA it runs) is what kv_rows_as_stored says it stores: the
// offline tools that estimate what the store's coders gain read those bytes.
static void test_rotated_rows_as_stored() {
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.f, 2.f);
    for (KvDtype dt : {KvDtype::Q8R, KvDtype::Q4R}) {
        KvCache cache(kv_config(1, 2, 64, 4, dt, 16, 64, 1));
        const int n = 40, row = 2 * 64;
        std::vector<float> k(static_cast<size_t>(n) * row), v(k.size());
        for (auto& x : k) x = dist(rng);
        for (auto& x : v) x = dist(rng);
        cache.append(0, k.data(), v.data(), n);
        for (int h = 0; h < 2; ++h) {
            std::vector<float> head_k(static_cast<size_t>(n) * 64), head_v(head_k.size()), sk(head_k.size()),
                sv(head_k.size()), want_k(head_k.size()), want_v(head_k.size());
            for (int t = 0; t < n; ++t)
                for (int d = 0; d < 64; ++d) {
                    head_k[t * 64 + d] = k[static_cast<size_t>(t) * row + h * 64 + d];
                    head_v[t * 64 + d] = v[static_cast<size_t>(t) * row + h * 64 + d];
                }
            std::vector<uint8_t> bytes(n * kv_row_bytes(dt, 64));
            kv_rows_as_stored(dt, head_k.data(), bytes.data(), n, 64);
            kv_rows_to_f32(dt, bytes.data(), want_k.data(), n, 64);
            kv_rows_as_stored(dt, head_v.data(), bytes.data(), n, 64);
            kv_rows_to_f32(dt, bytes.data(), want_v.data(), n, 64);
            hadamard_rows(want_k.data(), n, 64);  // read() rotates back
            hadamard_rows(want_v.data(), n, 64);
            cache.read(0, h, sk.data(), sv.data());
            CHECK(sk == want_k && sv == want_v, "%s head %d: the cache's stored rows are not kv_rows_as_stored's",
                  kv_dtype_name(dt), h);
        }
    }
}

int main() {
    test_pool_accounting();
    test_pool_subpage_neighbours();
    test_read_back();
    test_rotated_rows_as_stored();
    test_rss_returns();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all kv cache tests passed\n");
    return 0;
}
