// Q8Matrix (the native lm_head): a hand-computed block, the scalar reference against a float64
// brute force, every SIMD path and thread count against the scalar reference (and multiply_rows in
// pieces against multiply), bad shapes refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/head/q8_matrix.h"

#include "test_support.h"

using namespace mnn_h2o;

static void hand_computed_block() {
    // One row of one block: codes -16..15, scale 0.5 (fp16 0x3800), x = 1 everywhere but x[31] = 2.
    std::vector<int8_t> codes(32);
    for (int i = 0; i < 32; ++i) codes[i] = static_cast<int8_t>(i - 16);
    std::vector<float> x(32, 1.f);
    x[31] = 2.f;
    // sum(i - 16, i < 31) + 2 * 15 = (-16 + 14) * 31 / 2 + 30 = -31 + 30 = -1; times 0.5.
    const float want = -0.5f;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon}) {
        Q8Matrix m(1, 32, codes, {0x3800}, 1);
        float y = 0;
        m.multiply(x.data(), 1, &y, isa);
        CHECK(y == want, "%s: %g, want %g", isa_name(isa), y, want);
    }
}

static void random_matrices() {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> code(-127, 127);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int rows = 600, cols = 96, n = 3;  // rows: two full tasks of 256 and a partial one
    std::vector<int8_t> codes(static_cast<size_t>(rows) * cols);
    for (auto& c : codes) c = static_cast<int8_t>(code(rng));
    std::vector<uint16_t> scales(static_cast<size_t>(rows) * cols / 32);
    for (auto& s : scales) s = fp32_to_fp16(std::fabs(normal(rng)) * 0.01f);
    std::vector<float> x(static_cast<size_t>(n) * cols);
    for (auto& v : x) v = normal(rng);

    Q8Matrix ref_m(rows, cols, codes, scales, 1);
    std::vector<float> ref(static_cast<size_t>(n) * rows);
    ref_m.multiply(x.data(), n, ref.data(), Isa::Scalar);
    double worst = 0;
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
            double exact = 0, mag = 0;
            for (int c = 0; c < cols; ++c) {
                const double v = static_cast<double>(codes[static_cast<size_t>(r) * cols + c]) *
                                 fp16_to_fp32(scales[(static_cast<size_t>(r) * cols + c) / 32]) * x[t * cols + c];
                exact += v;
                mag += std::fabs(v);
            }
            worst = std::max(worst, std::fabs(ref[t * rows + r] - exact) / mag);
        }
    CHECK(worst < 1e-5, "scalar vs float64: relative error %g", worst);

    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
        for (int threads : {1, 2, 3}) {
            Q8Matrix m(rows, cols, codes, scales, threads);
            std::vector<float> y(ref.size(), NAN);
            m.multiply(x.data(), n, y.data(), isa);
            double err = 0;
            for (size_t i = 0; i < y.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(y[i] - ref[i])));
            // Reordered float sums of ~100 terms of size ~0.03: a few ulps of the magnitudes.
            CHECK(err < 1e-5, "%s, %d threads: max |y - scalar| %g", isa_name(isa), threads, err);
            if (isa == Isa::Scalar) CHECK(y == ref, "scalar, %d threads: not bit-identical to 1 thread", threads);
            // multiply_rows over uneven pieces (the decode layers' tasks) gives multiply's floats.
            std::vector<float> pieces(ref.size(), NAN);
            for (int r0 = 0; r0 < rows; r0 += 77) m.multiply_rows(x.data(), n, r0, std::min(rows, r0 + 77), pieces.data(), isa);
            CHECK(pieces == y, "%s: multiply_rows in pieces differs from multiply", isa_name(isa));
        }
}

static void bad_shapes() {
    CHECK(throws<std::invalid_argument>([] { Q8Matrix(1, 33, std::vector<int8_t>(33), {0, 0}, 1); }), "cols 33");
    CHECK(throws<std::invalid_argument>([] { Q8Matrix(0, 32, {}, {}, 1); }), "rows 0");
    CHECK(throws<std::invalid_argument>([] { Q8Matrix(2, 32, std::vector<int8_t>(32), {0, 0}, 1); }), "short codes");
    CHECK(throws<std::invalid_argument>([] { Q8Matrix(1, 32, std::vector<int8_t>(32), {0, 0}, 1); }), "extra scale");
    CHECK(throws<std::invalid_argument>([] { Q8Matrix(1, 32, std::vector<int8_t>(32), {0}, 0); }), "0 threads");
    Q8Matrix m(1, 32, std::vector<int8_t>(32), {0}, 1);
    CHECK(throws<std::invalid_argument>([&] { m.multiply(nullptr, 1, nullptr, best_isa()); }), "null x");
    std::vector<float> x(32), y(1);
    CHECK(throws<std::out_of_range>([&] { m.multiply_rows(x.data(), 1, 0, 2, y.data(), best_isa()); }), "rows past the end");
    CHECK(throws<std::out_of_range>([&] { m.multiply_rows(x.data(), 1, -1, 1, y.data(), best_isa()); }), "a negative row");
}

int main() {
    hand_computed_block();
    random_matrices();
    bad_shapes();
    std::printf("test_q8_matrix: %s (best isa %s)\n", g_failures ? "FAILED" : "ok", isa_name(best_isa()));
    return g_failures != 0;
}
