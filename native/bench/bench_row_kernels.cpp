// The decode layers' row kernels per weight type and ISA, one thread: one [rows x cols] matrix
// of random blocks times one activation, the ISAs interleaved round by round (the host's speed
// drifts within minutes: docs/notebook/kquant_decode_layers.md), medians with their spread.
//
//   build/bench_row_kernels [rows cols rounds threads types]
//
// Defaults 8960 1536 40 1 (the 1.5B's ffn_up, in the caches); types a comma list (Q4_K,Q6_K),
// default all. rows x cols past the last-level cache (rows 600000: ~500 MB of Q4_K) measures
// what DRAM feeds; threads > 1 split the rows over a ThreadPool as the decode layers do. Prints, per type, ms a product, GB/s of weights and G weights/s per ISA, and each ISA's time
// against the AVX2 kernel's (or scalar's where AVX2 is absent) measured in the same rounds.
// A speed figure, not a test: run it on a quiet machine.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/dense/q4_matrix.h"
#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/dense/weight_types.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "bench_support.h"
#include "mnn_h2o/runtime/thread_pool.h"

using namespace mnn_h2o;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const int rows = argc > 1 ? std::atoi(argv[1]) : 8960;
    const int cols = argc > 2 ? std::atoi(argv[2]) : 1536;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 40;
    const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
    const std::string types = argc > 5 ? argv[5] : "";
    if (rows <= 0 || cols <= 0 || cols % 256 != 0 || rounds <= 0 || threads <= 0) {
        std::fprintf(stderr, "usage: bench_row_kernels [rows cols rounds threads types] (cols a multiple of 256)\n");
        return 2;
    }
    ThreadPool pool(threads);
    // The rows in tasks of whole 32s, as the decode layers split them.
    const int tasks = threads == 1 ? 1 : 4 * threads;
    auto product = [&](const WeightMatrix& m, const Q8Activation& act, float* out, Isa isa) {
        if (threads == 1) return m.multiply_rows(act, 0, rows, out, isa);
        const int per = (rows / tasks + 31) / 32 * 32;
        pool.parallel_for(tasks, [&](int task, int) {
            const int r0 = std::min(rows, task * per), r1 = std::min(rows, r0 + per);
            if (r0 < r1) m.multiply_rows(act, r0, r1, out + r0, isa);
        });
    };
    std::vector<Isa> isas = {Isa::Scalar};
    const CpuFeatures& f = cpu_features();
    if (f.avx2_f16c_fma) isas.push_back(Isa::Avx2);
    if (f.avx512) isas.push_back(Isa::Avx512);
    if (f.neon) isas.push_back(Isa::Neon);
    const Isa base = isas.size() > 1 ? isas[1] : Isa::Scalar;
    std::printf("bench_row_kernels: [%d x %d], %d rounds, %d thread(s); best isa %s%s\n", rows, cols, rounds, threads,
                isa_name(best_isa()), f.avx512_vnni ? " (AVX-512 VNNI)" : "");
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = normal(rng);
    Q8Activation a;
    a.quantize(x.data(), cols);
    std::vector<float> y(static_cast<size_t>(rows));
    for (WeightType type : {WeightType::Q4_0, WeightType::Q4_1, WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K,
                            WeightType::Q5_0, WeightType::Q8_0}) {
        const WeightTypeTraits& t = weight_traits(type);
        if (!types.empty() && ("," + types + ",").find(std::string(",") + t.name + ",") == std::string::npos) continue;
        const size_t n_blocks = weight_row_bytes(t, cols) * static_cast<size_t>(rows) / t.block_bytes;
        const WeightMatrix m(cols, {{type, rows, random_blocks(t, n_blocks, rng)}});
        std::vector<std::vector<double>> ms(isas.size()), ratio(isas.size());
        for (int r = 0; r < rounds; ++r) {
            std::vector<double> round_ms(isas.size());
            for (size_t i = 0; i < isas.size(); ++i) {
                const int reps = isas[i] == Isa::Scalar ? 1 : 3;  // the scalar reference is slow
                const auto t0 = std::chrono::steady_clock::now();
                for (int k = 0; k < reps; ++k) product(m, a, y.data(), isas[i]);
                round_ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
                ms[i].push_back(round_ms[i]);
            }
            const size_t b = static_cast<size_t>(std::find(isas.begin(), isas.end(), base) - isas.begin());
            for (size_t i = 0; i < isas.size(); ++i) ratio[i].push_back(round_ms[b] / round_ms[i]);
        }
        std::printf("%-5s %8.1f MB", t.name, static_cast<double>(m.bytes()) / 1e6);
        for (size_t i = 0; i < isas.size(); ++i) {
            std::vector<double> rs = ratio[i];
            std::sort(rs.begin(), rs.end());
            const double med = median(ms[i]);
            std::printf(" | %s %.2f ms %.1f GB/s %.1f Gw/s, %.2fx %s (%.2f-%.2f)", isa_name(isas[i]), med,
                        static_cast<double>(m.bytes()) / med / 1e6, static_cast<double>(rows) * cols / med / 1e6,
                        median(ratio[i]), isa_name(base), rs[rs.size() / 10], rs[rs.size() - 1 - rs.size() / 10]);
        }
        std::printf("\n");
    }
    return 0;
}
