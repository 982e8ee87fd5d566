// A decode token's cache steps on Qwen2.5-1.5B's shape (28 layers, 2 kv heads, 12 query heads,
// head_dim 128, 16-token blocks; or SmolLM2-135M's: 30 layers, 3 kv heads, 9 query heads, head_dim
// 64): each layer's KvCache::step for one token (append, rotation,
// attention), then end_step, on a lent SpinTeam as decode_token makes them (an empty job on the
// team in place of each layer's products). The cache is first filled with a prompt
// of `context` random tokens.
//
//   build/bench_decode_step [context tokens dtype threads model]
//
// Defaults 512 256 q8r 2 qwen2.5-1.5b (or smollm2). Prints the median and range of ms a token over five runs of `tokens`
// tokens each (each run starts from the prompt's cache), which mean something only on a quiet machine;
// for instruction counts, which load does not change:
//
//   valgrind --tool=callgrind --toggle-collect='*decode_tokens*' build/bench_decode_step 512 16
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/runtime/spin_team.h"
#include "bench_support.h"

using namespace mnn_h2o;

namespace {

struct Shape {
    int layers, kv_heads, group, head_dim;
};


// As decode_token runs them: on a SpinTeam lent to the cache for the token, rested after it.
__attribute__((noinline)) void decode_tokens(KvCache& cache, SpinTeam& team, const std::vector<float>& q,
                                             const std::vector<float>& k, const std::vector<float>& v,
                                             std::vector<float>& out, int tokens, int layers) {
    for (int t = 0; t < tokens; ++t) {
        cache.lend_team(&team);
        for (int layer = 0; layer < layers; ++layer) {
            team.run(team.size(), [](int) {});  // the layer's products, which keep the workers polling
            cache.step(layer, q.data(), k.data(), v.data(), 1, out.data());
        }
        cache.lend_team(nullptr);
        team.rest();
        cache.end_step(1, false);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int context = argc > 1 ? std::atoi(argv[1]) : 512;
    const int tokens = argc > 2 ? std::atoi(argv[2]) : 256;
    const std::string dtype = argc > 3 ? argv[3] : "q8r";
    const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
    const std::string model = argc > 5 ? argv[5] : "qwen2.5-1.5b";
    KvDtype dt;
    if (context < 1 || tokens < 1 || threads < 1 || !enum_from_name(dtype, &dt) ||
        (model != "qwen2.5-1.5b" && model != "smollm2")) {
        std::fprintf(stderr, "usage: %s [context>=1 tokens>=1 dtype(f16|q8|q8r|...) threads>=1 qwen2.5-1.5b|smollm2]\n",
                     argv[0]);
        return 2;
    }
    const Shape sh = model == "smollm2" ? Shape{30, 3, 3, 64} : Shape{28, 2, 6, 128};
    const int kLayers = sh.layers, kKvHeads = sh.kv_heads, kGroup = sh.group, kHeadDim = sh.head_dim;
    constexpr int kRuns = 5;
    KvCacheConfig c;
    c.n_layers = kLayers;
    c.n_kv_heads = kKvHeads;
    c.n_heads = kKvHeads * kGroup;
    c.head_dim = kHeadDim;
    c.dtype = dt;
    c.block_tokens = 16;
    c.max_tokens = context + tokens;
    c.threads = threads;
    KvCache cache(c);

    const size_t q_row = static_cast<size_t>(kKvHeads) * kGroup * kHeadDim, kv_row = static_cast<size_t>(kKvHeads) * kHeadDim;
    {
        const std::vector<float> q = random_rows(context * q_row, 1), k = random_rows(context * kv_row, 2),
                                 v = random_rows(context * kv_row, 3);
        std::vector<float> out(context * q_row);
        for (int layer = 0; layer < kLayers; ++layer)
            cache.step(layer, q.data(), k.data(), v.data(), context, out.data());
        cache.end_step(context, true);
    }
    const std::vector<float> q = random_rows(q_row, 4), k = random_rows(kv_row, 5), v = random_rows(kv_row, 6);
    std::vector<float> out(q_row);
    SpinTeam team(threads);
    std::vector<double> ms;
    for (int r = 0; r < kRuns; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        decode_tokens(cache, team, q, k, v, out, tokens, kLayers);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / tokens);
        for (int layer = 0; layer < kLayers; ++layer)
            for (int h = 0; h < kKvHeads; ++h) cache.truncate(layer, h, context);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%s, %s, %d threads, %d-token context (+%d): %.3f ms a token (%.3f-%.3f), %.1f us a layer\n",
                model.c_str(), dtype.c_str(), threads, context, tokens, ms[kRuns / 2], ms.front(), ms.back(),
                1000.0 * ms[kRuns / 2] / kLayers);
    return 0;
}
