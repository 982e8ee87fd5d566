// The cost of query peaks (KvCache::set_query_peaks) on one layer of Qwen2.5-1.5B's shape (2 kv
// heads, 12 query heads, head_dim 128, q8 rows, 16-token blocks): a prompt of `chunks` chunks of
// `chunk` tokens through predicted_kvzip eviction, each chunk's step, predicted scores and
// end_step as the engine makes them, with query peaks on or off.
//
//   build/bench_query_peaks [on|off chunks chunk threads]
//
// Defaults on 16 256 1. Meant for instruction counts, which the machine's load does not change
// (the prompt alone is collected, not the random inputs):
//
//   valgrind --tool=callgrind --toggle-collect='*run_prompt*' build/bench_query_peaks on
//
// and the same with off; callgrind_annotate --inclusive=yes splits the total between the
// attention (KvCache::attend_checked) and the peaks (KvCache::add_query_peaks). Prints the wall
// time too, which means something only on a quiet machine.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mnn_h2o/cache/kv_cache.h"
#include "bench_support.h"

using namespace mnn_h2o;

namespace {

constexpr int kKvHeads = 2, kGroup = 6, kHeadDim = 128;

__attribute__((noinline)) void run_prompt(KvCache& cache, const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, const std::vector<float>& scores, int chunks,
                                          int chunk) {
    const size_t q_row = static_cast<size_t>(kKvHeads) * kGroup * kHeadDim, kv_row = static_cast<size_t>(kKvHeads) * kHeadDim;
    std::vector<float> out(static_cast<size_t>(chunk) * q_row);
    for (int c = 0; c < chunks; ++c) {
        const size_t first = static_cast<size_t>(c) * chunk;
        cache.step(0, q.data() + first * q_row, k.data() + first * kv_row, v.data() + first * kv_row, chunk, out.data());
        cache.set_token_scores(0, scores.data() + first * kKvHeads, chunk);
        cache.end_step(chunk, true);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const bool peaks = argc <= 1 || std::strcmp(argv[1], "off") != 0;
    const int chunks = argc > 2 ? std::atoi(argv[2]) : 16;
    const int chunk = argc > 3 ? std::atoi(argv[3]) : 256;
    const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
    if (chunks < 1 || chunk < 2 || threads < 1) {
        std::fprintf(stderr, "usage: %s [on|off chunks>=1 chunk>=2 threads>=1]\n", argv[0]);
        return 2;
    }
    const size_t n = static_cast<size_t>(chunks) * chunk;
    KvCacheConfig c;
    c.n_layers = 1;
    c.n_kv_heads = kKvHeads;
    c.n_heads = kKvHeads * kGroup;
    c.head_dim = kHeadDim;
    c.dtype = KvDtype::Q8;
    c.block_tokens = 16;
    c.max_tokens = static_cast<int>(n);
    c.threads = threads;
    KvCache cache(c);
    EvictionConfig e;
    e.policy = "predicted_kvzip";
    cache.enable_eviction(e);
    cache.set_query_peaks(peaks);

    const std::vector<float> q = random_rows(n * kKvHeads * kGroup * kHeadDim, 1);
    const std::vector<float> k = random_rows(n * kKvHeads * kHeadDim, 2);
    const std::vector<float> v = random_rows(n * kKvHeads * kHeadDim, 3);
    std::vector<float> scores = random_rows(n * kKvHeads, 4);
    for (float& s : scores) s = s * s / (1.f + s * s);  // a predicted score: in [0, 1)

    const auto t0 = std::chrono::steady_clock::now();
    run_prompt(cache, q, k, v, scores, chunks, chunk);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("query peaks %s: %d chunks of %d tokens, %d thread(s): %.1f ms; head 0 holds %d tokens\n",
                peaks ? "on" : "off", chunks, chunk, threads, ms, cache.length(0, 0));
    return 0;
}
