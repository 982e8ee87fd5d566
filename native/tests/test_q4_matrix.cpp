// Q4Matrix and Q8Activation (the decode layers' products): a hand-computed block, the activation's
// two roundings and pair layout, the scalar reference against a float64 product of the same
// rounded activation (odd and even block counts), every SIMD path against the scalar reference,
// bad shapes.
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/dense/q4_matrix.h"

#include "test_support.h"

using namespace mnn_h2o;

static const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon};

// The GGUF layout: byte j of a block holds value j (low nibble) and value j + 16 (high nibble).
static uint8_t nibble_of(const std::vector<uint8_t>& q, size_t block, int i) {
    const uint8_t byte = q[block * 16 + (i % 16)];
    return i < 16 ? byte & 15 : byte >> 4;
}

static void hand_computed_block() {
    // One block: nibbles 0..15 then 15..0, scale 0.5, min -1, so value i = nibble_i / 2 - 1; x = 1
    // everywhere (code 127, scale 1 / 127) but x[0] = 0.
    std::vector<uint8_t> q(16);
    for (int j = 0; j < 16; ++j) q[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> x(32, 1.f);
    x[0] = 0.f;
    Q8Activation a;
    a.quantize(x.data(), 32);
    CHECK(a.codes[1] == 127 && a.codes[0] == 0 && a.codes[32] == 127, "codes %d %d %d", a.codes[0], a.codes[1], a.codes[32]);
    CHECK(a.codes[16] == 0 && a.codes[48] == 0, "the missing odd block's codes must be zero");
    CHECK(a.sums[0] == 31.f && a.scales[0] == 1.f / 127.f, "sum %g scale %g", a.sums[0], a.scales[0]);
    CHECK(a.residual_scales[0] < 1e-8f, "residual scale %g of values 127 x (1 / 127)", a.residual_scales[0]);
    // sum over i >= 1 of (nibble_i / 2 - 1): nibbles 1..15 and 15..0 sum to 120 + 120; 31 values.
    const float want = 240.f / 2.f - 31.f;
    for (Isa isa : kIsas) {
        Q4Matrix m(1, 32, q, {fp32_to_fp16(0.5f)}, {fp32_to_fp16(-1.f)});
        float y = 0;
        m.multiply_rows(a, 0, 1, &y, isa);
        CHECK(std::fabs(y - want) < 1e-4f, "%s: %g, want %g", isa_name(isa), y, want);
    }
}

static void activation_rounding() {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.f, 2.f);
    std::vector<float> x(96);
    for (auto& v : x) v = normal(rng);
    x[40] = 0.f;
    for (int i = 64; i < 96; ++i) x[i] = 0.f;  // an all-zero block: scale 0, codes 0
    Q8Activation a;
    a.quantize(x.data(), 96);
    for (int b = 0; b < 3; ++b) {
        float amax = 0, sum = 0;
        for (int i = 0; i < 32; ++i) {
            amax = std::fmax(amax, std::fabs(x[b * 32 + i]));
            sum += x[b * 32 + i];
        }
        CHECK(a.scales[b] == amax / 127.f, "block %d: scale %g, amax %g", b, a.scales[b], amax);
        CHECK(std::fabs(a.sums[b] - sum) < 1e-5f, "block %d: sum %g, want %g", b, a.sums[b], sum);
        CHECK(a.residual_scales[b] <= a.scales[b] * 0.5f / 127.f * (1 + 1e-5f), "block %d: residual scale %g for scale %g",
              b, a.residual_scales[b], a.scales[b]);
        for (int i = 0; i < 32; ++i) {
            const size_t at = static_cast<size_t>((b / 2) * 64 + (b % 2) * 16 + (i < 16 ? i : 32 + i - 16));
            const float first = a.codes[at] * a.scales[b];
            const float err = std::fabs(first - x[b * 32 + i]);
            CHECK(err <= a.scales[b] * 0.5f * (1 + 1e-5f), "block %d value %d: |code x scale - x| %g", b, i, err);
            const float err2 = std::fabs(first + a.residual_codes[at] * a.residual_scales[b] - x[b * 32 + i]);
            CHECK(err2 <= a.residual_scales[b] * 0.5f * (1 + 1e-3f) + 1e-7f, "block %d value %d: after the residual %g", b, i, err2);
            CHECK(a.pair_scales[(b / 2) * 8 + (b % 2) * 4 + i % 4] == a.scales[b], "pair scale %d", b);
            CHECK(a.pair_residual_scales[(b / 2) * 8 + (b % 2) * 4 + i % 4] == a.residual_scales[b], "pair residual scale %d", b);
        }
    }
}

static void random_matrices(int cols) {
    std::mt19937 rng(static_cast<unsigned>(cols));
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int rows = 70, nb = cols / 32;
    std::vector<uint8_t> q(static_cast<size_t>(rows) * cols / 2);
    for (auto& v : q) v = static_cast<uint8_t>(byte(rng));
    std::vector<uint16_t> s(static_cast<size_t>(rows) * nb), m(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        s[i] = fp32_to_fp16(std::fabs(normal(rng)) * 0.01f);
        m[i] = fp32_to_fp16(normal(rng) * 0.05f);
    }
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = normal(rng);
    Q8Activation a;
    a.quantize(x.data(), cols);
    const Q4Matrix mat(rows, cols, q, s, m);
    std::vector<float> ref(static_cast<size_t>(rows));
    mat.multiply_rows(a, 0, rows, ref.data(), Isa::Scalar);
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
        double exact = 0, mag = 0;
        for (int b = 0; b < nb; ++b) {
            const size_t blk = static_cast<size_t>(r) * nb + b;
            for (int i = 0; i < 32; ++i) {
                const size_t at = static_cast<size_t>((b / 2) * 64 + (b % 2) * 16 + (i < 16 ? i : 32 + i - 16));
                const double rounded = a.codes[at] * static_cast<double>(a.scales[b]) +
                                       a.residual_codes[at] * static_cast<double>(a.residual_scales[b]);
                const double w = nibble_of(q, blk, i) * static_cast<double>(fp16_to_fp32(s[blk])) + fp16_to_fp32(m[blk]);
                // The rounded activation on the scale term, the float sum on the min term.
                const double v = nibble_of(q, blk, i) * static_cast<double>(fp16_to_fp32(s[blk])) * rounded +
                                 fp16_to_fp32(m[blk]) * static_cast<double>(x[static_cast<size_t>(b) * 32 + i]);
                exact += v;
                mag += std::fabs(w * x[static_cast<size_t>(b) * 32 + i]);
            }
        }
        worst = std::max(worst, std::fabs(ref[static_cast<size_t>(r)] - exact) / mag);
    }
    CHECK(worst < 1e-5, "cols %d: scalar vs float64: relative error %g", cols, worst);
    for (Isa isa : kIsas) {
        std::vector<float> y(static_cast<size_t>(rows), NAN);
        mat.multiply_rows(a, 0, 40, y.data(), isa);  // two calls over a row split, as the tasks do
        mat.multiply_rows(a, 40, rows, y.data() + 40, isa);
        double err = 0;
        for (int r = 0; r < rows; ++r) err = std::max(err, static_cast<double>(std::fabs(y[r] - ref[r])));
        CHECK(err < 1e-4, "cols %d, %s: max |y - scalar| %g", cols, isa_name(isa), err);
    }
}

static void bad_shapes() {
    auto make = [](int rows, int cols, size_t nq, size_t ns, size_t nm) {
        Q4Matrix(rows, cols, std::vector<uint8_t>(nq), std::vector<uint16_t>(ns), std::vector<uint16_t>(nm));
    };
    CHECK(throws<std::invalid_argument>([&] { make(1, 33, 16, 1, 1); }), "cols 33");
    CHECK(throws<std::invalid_argument>([&] { make(0, 32, 0, 0, 0); }), "rows 0");
    CHECK(throws<std::invalid_argument>([&] { make(2, 32, 16, 2, 2); }), "short nibbles");
    CHECK(throws<std::invalid_argument>([&] { make(1, 32, 16, 2, 1); }), "extra scale");
    CHECK(throws<std::invalid_argument>([&] { make(1, 32, 16, 1, 0); }), "missing min");
    const Q4Matrix m(2, 64, std::vector<uint8_t>(64), std::vector<uint16_t>(4), std::vector<uint16_t>(4));
    Q8Activation a;
    a.resize(32);
    float y[2];
    CHECK(throws<std::invalid_argument>([&] { m.multiply_rows(a, 0, 2, y, best_isa()); }), "activation of 32 for 64 cols");
    a.resize(64);
    CHECK(throws<std::out_of_range>([&] { m.multiply_rows(a, 1, 3, y, best_isa()); }), "rows past the end");
    CHECK(throws<std::out_of_range>([&] { m.multiply_rows(a, 2, 1, y, best_isa()); }), "r0 > r1");
}

int main() {
    hand_computed_block();
    activation_rounding();
    random_matrices(64);   // one pair per row
    random_matrices(96);   // an odd block count: the last pair half empty
    random_matrices(576);  // SmolLM2's hidden size (18 blocks)
    bad_shapes();
    std::printf("test_q4_matrix: %s (best isa %s)\n", g_failures ? "FAILED" : "ok", isa_name(best_isa()));
    return g_failures != 0;
}
