// The prompt's batched product (dense/batched_product.h) per weight type and ISA, one thread: one
// [rows x cols] matrix of random blocks times n activation rows (a prompt chunk), the ISAs
// interleaved round by round, medians with their spread (10th-90th percentile).
//
//   build/bench_batched_product [rows cols n rounds types]
//
// Defaults 8960 1536 256 15 (the 1.5B's ffn_up times one 256-token chunk); types a comma list
// (Q4_K,Q6_K), default Q4_K,Q6_K. Prints, per type and ISA, ms a product, G multiply-adds/s and
// its time against the AVX2 kernel's measured in the same rounds. The scalar reference is not
// timed (minutes a product). A speed figure, not a test: run it on a quiet machine.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/dense/batched_product.h"
#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/dense/weight_types.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "bench_support.h"

using namespace mnn_h2o;

namespace {

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
    const int rows = argc > 1 ? std::atoi(argv[1]) : 8960;
    const int cols = argc > 2 ? std::atoi(argv[2]) : 1536;
    const int n = argc > 3 ? std::atoi(argv[3]) : 256;
    const int rounds = argc > 4 ? std::atoi(argv[4]) : 15;
    const std::string types = argc > 5 ? argv[5] : "Q4_K,Q6_K";
    if (rows <= 0 || cols <= 0 || cols % 256 != 0 || n < kMinRows || rounds <= 0) {
        std::fprintf(stderr, "usage: bench_batched_product [rows cols n rounds types] (cols a multiple of 256, n >= %d)\n",
                     kMinRows);
        return 2;
    }
    std::vector<Isa> isas;
    const CpuFeatures& f = cpu_features();
    if (f.avx2_f16c_fma) isas.push_back(Isa::Avx2);
    if (f.avx512_vnni) isas.push_back(Isa::Avx512);
    if (f.neon) isas.push_back(Isa::Neon);
    if (isas.empty()) {
        std::fprintf(stderr, "bench_batched_product: no SIMD kernel on this machine\n");
        return 2;
    }
    std::printf("bench_batched_product: [%d x %d] x %d rows, %d rounds, one thread; best isa %s\n", rows, cols, n, rounds,
                isa_name(best_isa()));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(n) * cols);
    for (auto& v : x) v = normal(rng);
    std::vector<float> y(static_cast<size_t>(n) * rows);
    for (WeightType type : {WeightType::Q4_0, WeightType::Q4_1, WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K,
                            WeightType::Q5_0, WeightType::Q8_0}) {
        const WeightTypeTraits& t = weight_traits(type);
        if (("," + types + ",").find(std::string(",") + t.name + ",") == std::string::npos) continue;
        const size_t n_blocks = weight_row_bytes(t, cols) * static_cast<size_t>(rows) / t.block_bytes;
        const WeightMatrix m(cols, {{type, rows, random_blocks(t, n_blocks, rng)}});
        Q8Rows xq;
        xq.residual = m.reads_twice_rounded();
        xq.resize(n, cols);
        xq.quantize_rows(x.data(), cols, 0, n);
        multiply_batch(m, xq, 0, rows, y.data(), rows, isas[0]);  // untimed: first-touch of y
        std::vector<std::vector<double>> ms(isas.size()), ratio(isas.size());
        for (int r = 0; r < rounds; ++r) {
            std::vector<double> round_ms(isas.size());
            for (size_t i = 0; i < isas.size(); ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                multiply_batch(m, xq, 0, rows, y.data(), rows, isas[i]);
                round_ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                ms[i].push_back(round_ms[i]);
            }
            for (size_t i = 0; i < isas.size(); ++i) ratio[i].push_back(round_ms[0] / round_ms[i]);
        }
        std::printf("%-5s", t.name);
        for (size_t i = 0; i < isas.size(); ++i) {
            const double med = percentile(ms[i], 0.5);
            std::printf(" | %s %.1f ms (%.1f-%.1f) %.1f G mac/s, %.2fx %s", isa_name(isas[i]), med, percentile(ms[i], 0.1),
                        percentile(ms[i], 0.9), static_cast<double>(rows) * cols * n / med / 1e6,
                        percentile(ratio[i], 0.5), isa_name(isas[0]));
        }
        std::printf("\n");
    }
    return 0;
}
