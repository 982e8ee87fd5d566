// The weight types' table and WeightMatrix: hand-made Q5_0, Q8_0, Q4_K, Q5_K and Q6_K blocks packed here from the
// layout in weight_types.h (an independent packer, not the decoder run backwards) decode to the
// values they were made from; on random blocks the scalar kernels match a float64 product of the
// same rounded activation, every SIMD path matches the scalar one, a stack of parts of different
// types matches each part alone, Q4_0 / Q4_1 parts match Q4Matrix; bad input is refused by name.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/dense/batched_product.h"
#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/dense/weight_types.h"

#include "test_support.h"

using namespace mnn_h2o;

static const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon};

static void put_half(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// One Q4_K block from its 6-bit scales s[8], mins m[8] and 4-bit values n[256].
static std::vector<uint8_t> pack_q4_k(float d, float dmin, const int* s, const int* m, const int* n) {
    std::vector<uint8_t> b(144, 0);
    put_half(&b[0], d);
    put_half(&b[2], dmin);
    uint8_t* sc = &b[4];
    for (int j = 0; j < 4; ++j) {
        sc[j] = static_cast<uint8_t>((s[j] & 63) | ((s[j + 4] >> 4) << 6));
        sc[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        sc[j + 8] = static_cast<uint8_t>((s[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    for (int g = 0; g < 4; ++g)
        for (int l = 0; l < 32; ++l) b[16 + 32 * g + l] = static_cast<uint8_t>(n[64 * g + l] | (n[64 * g + 32 + l] << 4));
    return b;
}

// One Q5_K block: Q4_K's with the fifth bits of the 5-bit values n[256] in qh.
static std::vector<uint8_t> pack_q5_k(float d, float dmin, const int* s, const int* m, const int* n) {
    int low[256];
    for (int i = 0; i < 256; ++i) low[i] = n[i] & 15;
    const std::vector<uint8_t> q4 = pack_q4_k(d, dmin, s, m, low);
    std::vector<uint8_t> b(176, 0);
    std::memcpy(&b[0], &q4[0], 16);       // d, dmin, scales
    std::memcpy(&b[48], &q4[16], 128);    // the nibbles
    for (int i = 0; i < 256; ++i) b[16 + i % 32] = static_cast<uint8_t>(b[16 + i % 32] | ((n[i] >> 4) << (i / 32)));
    return b;
}

// One Q6_K block from its int8 scales sc[16] and 6-bit values q[256].
static std::vector<uint8_t> pack_q6_k(float d, const int* sc, const int* q) {
    std::vector<uint8_t> b(210, 0);
    for (int i = 0; i < 256; ++i) {
        const int h = i / 128, t = (i % 128) / 32, l = i % 32;
        uint8_t& low = b[64 * h + 32 * (t % 2) + l];
        low = static_cast<uint8_t>(low | ((q[i] & 15) << (t >= 2 ? 4 : 0)));
        b[128 + 32 * h + l] = static_cast<uint8_t>(b[128 + 32 * h + l] | ((q[i] >> 4) << (2 * t)));
    }
    for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc[s]));
    put_half(&b[208], d);
    return b;
}

// The activation's k-quant form: whole super-blocks, one step per super-block times an integer
// multiplier 1..kMaxMultiplier per block, each block's step at least its amax / 127 (no clipping)
// and at most one super-block step above it; one rounding leaves at most half a step; the errors
// and rounded sums as float64 computes them from the codes.
static void kquant_activation() {
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> x(768);
    for (auto& v : x) v = normal(rng);
    for (int i = 0; i < 32; ++i) x[40 + i] *= 50.f;   // an outlier block in super-block 0
    for (int i = 0; i < 32; ++i) x[300 + i] *= 1e-4f; // a tiny one in super-block 1
    for (int i = 512; i < 544; ++i) x[i] = 0.f;       // an all-zero block in super-block 2
    Q8Activation a;
    a.quantize(x.data(), 768);
    CHECK(a.seq_codes.size() == 768 && a.super_steps.size() == 3 && a.multipliers.size() == 24 &&
              a.rounding_errors.size() == 24 && a.rounded_sums16.size() == 48,
          "k-quant form sizes");
    Q8Activation narrow;
    narrow.quantize(x.data(), 96);
    CHECK(narrow.seq_codes.empty() && narrow.super_steps.empty(), "a width of 96 has no k-quant form");
    double worst = 0;
    for (int k = 0; k < 3; ++k) {
        float top = 0;
        for (int i = 0; i < 256; ++i) top = std::max(top, std::fabs(x[256 * k + i]));
        const double t = a.super_steps[k];
        for (int b = 8 * k; b < 8 * k + 8; ++b) {
            float amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
            const int m = a.multipliers[b];
            CHECK(m >= 1 && m <= Q8Activation::kMaxMultiplier, "block %d: multiplier %d", b, m);
            const double step = t * m;
            CHECK(amax == 0 || step * 127 >= amax * (1 - 1e-5), "block %d: step %g clips amax %g", b, step, amax);
            CHECK(step * 127 <= amax + 127 * t * (1 + 1e-5), "block %d: step %g for amax %g", b, step, amax);
            double exact = 0, rounded = 0;
            for (int i = 32 * b; i < 32 * b + 32; ++i) {
                const double r = a.seq_codes[i] * step;
                worst = std::max(worst, std::fabs(r - x[i]) / top);
                exact += x[i];
                rounded += r;
                if (i % 16 == 15) {
                    const double got = a.rounded_sums16[static_cast<size_t>(i / 16)];
                    double want = 0;
                    for (int l = i - 15; l <= i; ++l) want += a.seq_codes[l] * step;
                    CHECK(std::fabs(got - want) <= 1e-5 * (std::fabs(want) + top), "values %d: rounded sum %g, want %g", i - 15,
                          got, want);
                }
            }
            CHECK(std::fabs(a.rounding_errors[b] - (exact - rounded)) <= 1e-5 * (32 * top),
                  "block %d: rounding error %g, want %g", b, a.rounding_errors[b], exact - rounded);
        }
    }
    CHECK(worst <= 0.5 / 127 * (1 + 1e-4), "k-quant form: max |rounded - x| / super-block amax %g", worst);
}

static void table() {
    size_t n = 0;
    const WeightTypeTraits* t = weight_traits_table(&n);
    CHECK(n == 7, "%zu types", n);
    for (size_t i = 0; i < n; ++i) {
        CHECK(&weight_traits(t[i].type) == &t[i], "%s by type", t[i].name);
        CHECK(find_weight_traits(t[i].name) == &t[i], "%s by name", t[i].name);
    }
    CHECK(weight_traits(WeightType::Q4_K).block_bytes == 144 && weight_traits(WeightType::Q5_K).block_bytes == 176 &&
              weight_traits(WeightType::Q6_K).block_bytes == 210,
          "k-quant block bytes");
    CHECK(weight_row_bytes(weight_traits(WeightType::Q4_K), 1536) == 6 * 144, "Q4_K row bytes");
    CHECK(throws<std::invalid_argument>([] { weight_traits(7); }), "Q5_1 (7) is not in the table");
    CHECK(find_weight_traits("Q5_1") == nullptr, "Q5_1 by name");
    CHECK(weight_traits(WeightType::Q5_0).block_bytes == 22 && weight_traits(WeightType::Q8_0).block_bytes == 34,
          "Q5_0 / Q8_0 block bytes");
    CHECK(throws<std::invalid_argument>([] { weight_row_bytes(weight_traits(WeightType::Q4_K), 288); }),
          "a Q4_K row of 288");
}

static void hand_made_blocks() {
    int s[8] = {1, 17, 33, 63, 5, 40, 21, 62}, m[8] = {0, 63, 2, 31, 48, 7, 60, 16}, n[256];
    for (int i = 0; i < 256; ++i) n[i] = (i * 7 + 3) % 16;
    const float d = 0.25f, dmin = 0.125f;
    std::vector<uint8_t> b = pack_q4_k(d, dmin, s, m, n);
    std::vector<float> out(256);
    weight_traits(WeightType::Q4_K).dequantize(b.data(), out.data(), 1);
    int bad = 0;
    for (int i = 0; i < 256; ++i)
        if (out[i] != d * s[i / 32] * n[i] - dmin * m[i / 32]) ++bad;
    CHECK(bad == 0, "Q4_K: %d of 256 values differ from d s n - dmin m", bad);

    int n5[256];
    for (int i = 0; i < 256; ++i) n5[i] = (i * 13 + 7) % 32;
    b = pack_q5_k(d, dmin, s, m, n5);
    weight_traits(WeightType::Q5_K).dequantize(b.data(), out.data(), 1);
    bad = 0;
    for (int i = 0; i < 256; ++i)
        if (out[i] != d * s[i / 32] * n5[i] - dmin * m[i / 32]) ++bad;
    CHECK(bad == 0, "Q5_K: %d of 256 values differ from d s n - dmin m", bad);

    int sc[16], q[256];
    for (int i = 0; i < 16; ++i) sc[i] = (i * 37) % 255 - 127;
    for (int i = 0; i < 256; ++i) q[i] = (i * 11 + 5) % 64;
    b = pack_q6_k(0.5f, sc, q);
    weight_traits(WeightType::Q6_K).dequantize(b.data(), out.data(), 1);
    bad = 0;
    for (int i = 0; i < 256; ++i)
        if (out[i] != 0.5f * sc[i / 16] * (q[i] - 32)) ++bad;
    CHECK(bad == 0, "Q6_K: %d of 256 values differ from d sc (q - 32)", bad);

    // Q5_0: value i = (nibble + 16 bit i of qh - 16) d, packed here bit by bit.
    std::vector<uint8_t> q50(22, 0);
    put_half(&q50[0], 0.5f);
    int n50[32];
    for (int i = 0; i < 32; ++i) {
        n50[i] = (i * 11 + 3) % 32;
        q50[6 + i % 16] |= static_cast<uint8_t>((n50[i] & 15) << (i < 16 ? 0 : 4));
        q50[2 + i / 8] |= static_cast<uint8_t>((n50[i] >> 4) << (i % 8));
    }
    std::vector<float> o50(32);
    weight_traits(WeightType::Q5_0).dequantize(q50.data(), o50.data(), 1);
    bad = 0;
    for (int i = 0; i < 32; ++i) bad += o50[i] != 0.5f * (n50[i] - 16);
    CHECK(bad == 0, "Q5_0: %d of 32 values differ from (n - 16) d", bad);
    std::vector<uint8_t> q80(34);
    put_half(&q80[0], 0.25f);
    for (int i = 0; i < 32; ++i) q80[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i * 8 - 128));
    std::vector<float> o80(32);
    weight_traits(WeightType::Q8_0).dequantize(q80.data(), o80.data(), 1);
    bad = 0;
    for (int i = 0; i < 32; ++i) bad += o80[i] != 0.25f * (i * 8 - 128);
    CHECK(bad == 0, "Q8_0: %d of 32 values differ from q d", bad);

    // Q4_0 and Q4_1: the classic blocks.
    std::vector<uint8_t> q40(18), q41(20);
    put_half(&q40[0], 2.f);
    put_half(&q41[0], 2.f);
    put_half(&q41[2], -3.f);
    for (int j = 0; j < 16; ++j) q40[2 + j] = q41[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> o0(32), o1(32);
    weight_traits(WeightType::Q4_0).dequantize(q40.data(), o0.data(), 1);
    weight_traits(WeightType::Q4_1).dequantize(q41.data(), o1.data(), 1);
    CHECK(o0[1] == (1 - 8) * 2.f && o0[16] == (15 - 8) * 2.f && o1[1] == 2.f - 3.f && o1[17] == 14 * 2.f - 3.f,
          "Q4_0 / Q4_1 values %g %g %g %g", o0[1], o0[16], o1[1], o1[17]);
}

// Random blocks of a type with finite, small scales.
static std::vector<uint8_t> random_blocks(WeightType type, size_t n_blocks, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> normal(0.f, 1.f);
    const WeightTypeTraits& t = weight_traits(type);
    std::vector<uint8_t> b(n_blocks * t.block_bytes);
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    for (size_t k = 0; k < n_blocks; ++k) {
        uint8_t* p = &b[k * t.block_bytes];
        switch (type) {
            case WeightType::Q4_0:
            case WeightType::Q5_0:
            case WeightType::Q8_0: put_half(p, std::fabs(normal(rng)) * 0.01f); break;
            case WeightType::Q4_1:
                put_half(p, std::fabs(normal(rng)) * 0.01f);
                put_half(p + 2, normal(rng) * 0.05f);
                break;
            case WeightType::Q4_K:
            case WeightType::Q5_K:
                put_half(p, std::fabs(normal(rng)) * 0.002f);
                put_half(p + 2, std::fabs(normal(rng)) * 0.002f);
                break;
            case WeightType::Q6_K: put_half(p + 208, normal(rng) * 0.0005f); break;
            default: break;
        }
    }
    return b;
}

// The float64 product the kernels compute (weight_matrix.h): the rounded activation on the values'
// scale terms, the float sums on Q4_K's / Q5_K's mins, and the rounding errors at the codes'
// centre on the scales; Q6_K: its values (offset included) on the rounded activation. centred
// false: without the errors' part (Q6_K: its offset on the float sums), as a plain one rounding.
static double exact_row(WeightType type, const uint8_t* row, int cols, const Q8Activation& a, const float* x,
                        bool centred = true) {
    const int sb = cols / 256;
    double acc = 0;
    if (type == WeightType::Q5_0 || type == WeightType::Q8_0) {  // the pair form's first rounding
        const WeightTypeTraits& t = weight_traits(type);
        for (int b = 0; b < cols / 32; ++b) {
            float v[32];
            t.dequantize(row + static_cast<size_t>(b) * t.block_bytes, v, 1);
            for (int i = 0; i < 32; ++i) {
                const int8_t c = a.codes[64 * static_cast<size_t>(b / 2) + 16 * (b % 2) + (i < 16 ? i : i + 16)];
                acc += static_cast<double>(v[i]) * a.scales[static_cast<size_t>(b)] * c;
            }
        }
        return acc;
    }
    auto rounded = [&](int i) {
        return a.seq_codes[i] * static_cast<double>(a.super_steps[i / 256]) * a.multipliers[i / 32];
    };
    for (int k = 0; k < sb; ++k) {
        const uint8_t* b = row + static_cast<size_t>(k) * weight_traits(type).block_bytes;
        if (type == WeightType::Q4_K || type == WeightType::Q5_K) {
            // Unpack through the dequantiser with dmin = 0 and with d = 0 to split the two terms,
            // and with every value's code 1 (dmin = 0) for the sub-blocks' d s_j.
            const int bytes = weight_traits(type).block_bytes, qs = type == WeightType::Q5_K ? 48 : 16;
            std::vector<uint8_t> scale_only(b, b + bytes), min_only(b, b + bytes), ones(b, b + bytes);
            put_half(&scale_only[2], 0.f);
            put_half(&min_only[0], 0.f);
            put_half(&ones[2], 0.f);
            std::fill(ones.begin() + qs, ones.end(), static_cast<uint8_t>(0x11));
            if (type == WeightType::Q5_K) std::fill(ones.begin() + 16, ones.begin() + 48, static_cast<uint8_t>(0));
            float vs[256], vm[256], ds[256];
            weight_traits(type).dequantize(scale_only.data(), vs, 1);
            weight_traits(type).dequantize(min_only.data(), vm, 1);
            weight_traits(type).dequantize(ones.data(), ds, 1);
            const double centre = type == WeightType::Q5_K ? 15.5 : 7.5;
            for (int i = 0; i < 256; ++i) acc += vs[i] * rounded(256 * k + i) + vm[i] * static_cast<double>(x[256 * k + i]);
            if (centred)
                for (int j = 0; j < 8; ++j) acc += centre * ds[32 * j] * static_cast<double>(a.rounding_errors[8 * k + j]);
        } else {
            uint16_t h;
            std::memcpy(&h, b + 208, 2);
            const double d = fp16_to_fp32(h);
            float v[256];
            weight_traits(type).dequantize(b, v, 1);
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            for (int i = 0; i < 256; ++i) {
                if (centred) {
                    acc += static_cast<double>(v[i]) * rounded(256 * k + i);
                    continue;
                }
                // v = d sc (q - 32): d sc q on the rounded activation, -32 d sc on the float one
                const double dsc = d * sc[i / 16];
                const double q = dsc != 0 ? std::round(v[i] / dsc) + 32 : 0;
                acc += dsc * q * rounded(256 * k + i) - 32 * dsc * static_cast<double>(x[256 * k + i]);
            }
        }
    }
    return acc;
}

static void random_matrices(WeightType type, int cols) {
    std::mt19937 rng(static_cast<unsigned>(cols) * 31u + static_cast<unsigned>(type));
    std::normal_distribution<float> normal(0.f, 1.f);
    const int rows = 70;
    const WeightTypeTraits& t = weight_traits(type);
    const size_t row_bytes = weight_row_bytes(t, cols);
    std::vector<uint8_t> blocks = random_blocks(type, rows * row_bytes / t.block_bytes, rng);
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = normal(rng);
    Q8Activation a;
    a.quantize(x.data(), cols);
    const WeightMatrix mat(cols, {{type, rows, blocks}});
    CHECK(mat.rows() == rows && mat.bytes() == blocks.size(), "%s: rows %d bytes %zu", t.name, mat.rows(), mat.bytes());
    std::vector<float> ref(static_cast<size_t>(rows));
    mat.multiply_rows(a, 0, rows, ref.data(), Isa::Scalar);
    double worst = 0, worst_plain = 0, off = 0, off_uncentred = 0;
    std::vector<float> w(static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
        const uint8_t* row = &blocks[static_cast<size_t>(r) * row_bytes];
        t.dequantize(row, w.data(), static_cast<size_t>(cols / t.block_values));
        double plain = 0, mag = 0;
        for (int i = 0; i < cols; ++i) {
            plain += static_cast<double>(w[i]) * x[i];
            mag += std::fabs(static_cast<double>(w[i]) * x[i]);
        }
        const double exact = exact_row(type, row, cols, a, x.data());
        worst = std::max(worst, std::fabs(ref[static_cast<size_t>(r)] - exact) / mag);
        worst_plain = std::max(worst_plain, std::fabs(ref[static_cast<size_t>(r)] - plain) / mag);
        off += std::fabs(exact - plain);
        off_uncentred += std::fabs(exact_row(type, row, cols, a, x.data(), false) - plain);
    }
    CHECK(worst < 1e-5, "%s cols %d: scalar vs float64 of the rounded activation: relative error %g", t.name, cols, worst);
    // One rounding leaves up to half a step (1 / 254 of the super-block's largest value) per value;
    // over a row those errors meet the weights centred, which the uncentred product does not.
    CHECK(worst_plain < 5e-3, "%s cols %d: scalar vs float64 of the float activation: relative error %g", t.name, cols,
          worst_plain);
    if (t.block_values == 256)  // the k-quant form's centring (Q5_0 / Q8_0's codes are centred on 0)
        CHECK(off < 0.8 * off_uncentred, "%s cols %d: the centred product's mean error %g, uncentred %g", t.name, cols,
              off / rows, off_uncentred / rows);
    for (Isa isa : kIsas) {
        std::vector<float> y(static_cast<size_t>(rows), NAN);
        mat.multiply_rows(a, 0, 40, y.data(), isa);  // two calls over a row split, as the tasks do
        mat.multiply_rows(a, 40, rows, y.data() + 40, isa);
        double err = 0, mag = 0;
        for (int r = 0; r < rows; ++r) {
            err = std::max(err, static_cast<double>(std::fabs(y[r] - ref[r])));
            mag = std::max(mag, static_cast<double>(std::fabs(ref[r])));
        }
        CHECK(err <= 1e-5 * mag + 1e-6, "%s cols %d, %s: max |y - scalar| %g (max |y| %g)", t.name, cols, isa_name(isa), err,
              mag);
    }
}

// Parts of different types stacked: each row as its part alone; Q4_0 / Q4_1 as Q4Matrix.
static void stacked_parts() {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int cols = 512;
    const WeightType types[] = {WeightType::Q4_K, WeightType::Q4_1, WeightType::Q6_K, WeightType::Q4_0,
                                WeightType::Q5_K, WeightType::Q5_0, WeightType::Q8_0};
    const int rows[] = {64, 32, 40, 24, 16, 8, 24};
    std::vector<WeightMatrix::Part> parts;
    std::vector<std::vector<uint8_t>> bytes(7);
    std::vector<WeightMatrix> alone;
    for (int p = 0; p < 7; ++p) {
        const WeightTypeTraits& t = weight_traits(types[p]);
        std::vector<uint8_t>& b = bytes[p];
        b = random_blocks(types[p], rows[p] * weight_row_bytes(t, cols) / t.block_bytes, rng);
        parts.push_back({types[p], rows[p], b.data(), b.size()});
        alone.emplace_back(cols, std::vector<WeightMatrix::Part>{{types[p], rows[p], b.data(), b.size()}});
    }
    const WeightMatrix stack(cols, parts);
    // The same parts written by fills (a file read into the matrix's own memory) instead of views.
    std::vector<WeightMatrix::Part> filled;
    for (int p = 0; p < 7; ++p) {
        const std::vector<uint8_t>* b = &bytes[p];
        filled.emplace_back(types[p], rows[p], b->size(), [b](uint8_t* dst) { std::memcpy(dst, b->data(), b->size()); });
    }
    const WeightMatrix from_fills(cols, filled);
    CHECK(stack.rows() == 208 && stack.type_names() == "Q4_K+Q4_1+Q6_K+Q4_0+Q5_K+Q5_0+Q8_0", "%d rows, %s", stack.rows(),
          stack.type_names().c_str());
    std::vector<float> x(cols);
    for (auto& v : x) v = normal(rng);
    Q8Activation a;
    a.quantize(x.data(), cols);
    for (Isa isa : kIsas) {
        std::vector<float> y(208), want;
        stack.multiply_rows(a, 0, 50, y.data(), isa);  // a split inside the first part
        stack.multiply_rows(a, 50, 208, y.data() + 50, isa);
        for (const WeightMatrix& m : alone) {
            std::vector<float> part(static_cast<size_t>(m.rows()));
            m.multiply_rows(a, 0, m.rows(), part.data(), isa);
            want.insert(want.end(), part.begin(), part.end());
        }
        int bad = 0;
        for (int r = 0; r < 208; ++r) bad += y[r] != want[r];
        CHECK(bad == 0, "%s: %d of 208 stacked rows differ from their part alone", isa_name(isa), bad);
        std::vector<float> z(208);
        from_fills.multiply_rows(a, 0, 208, z.data(), isa);
        CHECK(z == y, "%s: the matrix from fills differs from the one from views", isa_name(isa));
    }
    // Q4_1 through WeightMatrix against Q4Matrix over the same nibbles, scales and mins.
    const std::vector<uint8_t>& b = bytes[1];
    const size_t nb = b.size() / 20;
    std::vector<uint8_t> nib(nb * 16);
    std::vector<uint16_t> s(nb), m(nb);
    for (size_t k = 0; k < nb; ++k) {
        std::memcpy(&s[k], &b[k * 20], 2);
        std::memcpy(&m[k], &b[k * 20 + 2], 2);
        std::memcpy(&nib[k * 16], &b[k * 20 + 4], 16);
    }
    const Q4Matrix q4(32, cols, nib, s, m);
    std::vector<float> y1(32), y2(32);
    q4.multiply_rows(a, 0, 32, y1.data(), best_isa());
    alone[1].multiply_rows(a, 0, 32, y2.data(), best_isa());
    CHECK(y1 == y2, "Q4_1 through WeightMatrix differs from Q4Matrix");
}

// An activation without its pair form (Q8Activation::pair_form, the decode layers' choice where no
// matrix reads it): a k-quant matrix's products bit for bit those over the full activation; a
// matrix that reads the pair form refuses it.
static void without_pair_form() {
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int cols = 1536, rows = 24;
    std::vector<float> x(cols);
    for (auto& v : x) v = normal(rng);
    Q8Activation full, lean;
    lean.pair_form = false;
    full.quantize(x.data(), cols);
    lean.quantize(x.data(), cols);
    CHECK(lean.codes.empty() && lean.scales.empty() && lean.pair_sums.empty() && lean.sums == full.sums &&
              lean.seq_codes == full.seq_codes && lean.rounding_errors == full.rounding_errors,
          "the lean activation holds the pair form, or its sums / k-quant form differ");
    for (WeightType type : {WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K}) {
        const WeightTypeTraits& t = weight_traits(type);
        const WeightMatrix m(cols, {{type, rows, random_blocks(type, rows * weight_row_bytes(t, cols) / t.block_bytes, rng)}});
        CHECK(!m.reads_pair_form(), "%s reads the pair form", t.name);
        for (Isa isa : kIsas) {
            std::vector<float> a(rows), b(rows);
            m.multiply_rows(full, 0, rows, a.data(), isa);
            m.multiply_rows(lean, 0, rows, b.data(), isa);
            CHECK(a == b, "%s, %s: products over the lean activation differ", t.name, isa_name(isa));
        }
    }
    for (WeightType type : {WeightType::Q4_0, WeightType::Q5_0, WeightType::Q8_0}) {
        const WeightTypeTraits& t = weight_traits(type);
        const WeightMatrix m(cols, {{type, 2, random_blocks(type, 2 * weight_row_bytes(t, cols) / t.block_bytes, rng)}});
        float y[2];
        CHECK(m.reads_pair_form(), "%s does not read the pair form", t.name);
        CHECK(throws<std::invalid_argument>([&] { m.multiply_rows(lean, 0, 2, y, best_isa()); }),
              "%s took an activation without its pair form", t.name);
    }
}

static void bad_input() {
    std::mt19937 rng(5);
    const std::vector<uint8_t> one = random_blocks(WeightType::Q4_K, 1, rng);
    // A fill that fails (a short file) passes its error on, for blocks and for block pairs; a
    // fill's bytes are checked as a view's are (a NaN scale refused); a part needs one or the other.
    const auto failing = [](uint8_t*) { throw std::runtime_error("short read"); };
    CHECK(throws<std::runtime_error>([&] { WeightMatrix(256, {{WeightType::Q4_K, 1, one.size(), failing}}); }),
          "a failing fill, k-quant");
    CHECK(throws<std::runtime_error>([&] { WeightMatrix(32, {{WeightType::Q4_1, 1, size_t{20}, failing}}); }),
          "a failing fill, block pairs");
    const auto nan_scale = [&one](uint8_t* dst) {
        std::memcpy(dst, one.data(), one.size());
        put_half(dst, NAN);
    };
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {{WeightType::Q4_K, 1, one.size(), nan_scale}}); }),
          "a filled NaN scale");
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {{WeightType::Q4_K, 1, one.size(), {}}}); }),
          "neither bytes nor a fill");
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {{WeightType::Q4_K, 2, one}}); }), "short blocks");
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(288, {{WeightType::Q4_K, 1, one}}); }), "288 columns of Q4_K");
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(64, {{WeightType::Q8_0, 1, std::vector<uint8_t>(34)}}); }),
          "one Q8_0 block for a row of 64");
    std::vector<uint8_t> q5 = random_blocks(WeightType::Q5_0, 1, rng);
    put_half(&q5[0], INFINITY);
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(32, {{WeightType::Q5_0, 1, q5}}); }), "an infinite Q5_0 d");
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {}); }), "no parts");
    std::vector<uint8_t> nan = one;
    put_half(&nan[0], NAN);
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {{WeightType::Q4_K, 1, nan}}); }), "a NaN scale");
    std::vector<uint8_t> q6 = random_blocks(WeightType::Q6_K, 1, rng);
    put_half(&q6[208], INFINITY);
    CHECK(throws<std::invalid_argument>([&] { WeightMatrix(256, {{WeightType::Q6_K, 1, q6}}); }), "an infinite Q6_K d");
    try {
        WeightMatrix(256, {{WeightType::Q4_K, 1, one}, {WeightType::Q8_0, 1, std::vector<uint8_t>(7 * 34)}});
        CHECK(false, "a short Q8_0 part was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("part 1 (Q8_0)") != std::string::npos, "message: %s", e.what());
    }
    const WeightMatrix m(256, {{WeightType::Q4_K, 1, one}});
    Q8Activation a;
    a.resize(128);
    float y[1];
    CHECK(throws<std::invalid_argument>([&] { m.multiply_rows(a, 0, 1, y, best_isa()); }), "activation of 128 for 256");
    a.resize(256);
    CHECK(throws<std::out_of_range>([&] { m.multiply_rows(a, 0, 2, y, best_isa()); }), "rows past the end");
}

// The weight types' integer form (weight_types.h) is the reference dequantiser's values: a u + b.
static void integer_forms() {
    std::mt19937 rng(3);
    size_t n_types = 0;
    const WeightTypeTraits* table = weight_traits_table(&n_types);
    for (size_t k = 0; k < n_types; ++k) {
        const WeightTypeTraits& t = table[k];
        CHECK(t.integer_form != nullptr, "%s: held by the decode layers without an integer form", t.name);
        if (t.integer_form == nullptr) continue;
        const int u_max = t.type == WeightType::Q8_0 ? 255 : 63;  // Q8_0's q + 128: split by the batched product
        const size_t nb = 6, values = nb * t.block_values;
        const std::vector<uint8_t> b = random_blocks(t.type, nb, rng);
        std::vector<float> ref(values), a(values / kIntegerGroup), o(values / kIntegerGroup);
        std::vector<uint8_t> u(values);
        t.dequantize(b.data(), ref.data(), nb);
        t.integer_form(b.data(), u.data(), a.data(), o.data(), nb);
        for (size_t i = 0; i < values; ++i) {
            const float v = a[i / kIntegerGroup] * u[i] + o[i / kIntegerGroup];
            CHECK(u[i] <= u_max && std::fabs(v - ref[i]) <= 1e-6f * (std::fabs(ref[i]) + std::fabs(o[i / kIntegerGroup])),
                  "%s value %zu: u %d, a u + b %g, dequantised %g", t.name, i, u[i], v, ref[i]);
        }
        // The batched product meets the floats once per integer_group columns: a and b equal there.
        CHECK(t.integer_group % kIntegerGroup == 0 && t.block_values % t.integer_group == 0, "%s: group %d", t.name,
              t.integer_group);
        const size_t per = static_cast<size_t>(t.integer_group / kIntegerGroup);
        for (size_t g = 0; g < a.size(); ++g)
            CHECK(a[g] == a[g / per * per] && o[g] == o[g / per * per], "%s group %zu: a or b differ within %d columns",
                  t.name, g, t.integer_group);
    }
}

// The batched product (batched_product.h) of a stack of parts: the scalar path against float64 of
// the same rounded activation on the integer form (rounded twice, and for k-quant rows once too;
// the rounding errors at each group's mean u), and within the last rounding's own bound of what is
// left (sum over columns of its step / 2 |a (u - mean u)|) of the float64 product of the unrounded x and the dequantised values; every SIMD path against the scalar one; any split of the rows (the decode
// layers' tasks) bit for bit the whole; ragged edges (rows not a multiple of the panel, a last
// column panel shorter than 256, activation rows not a multiple of any tile).
static void batched_product(const std::vector<WeightType>& types, const std::vector<int>& rows, int cols) {
    std::mt19937 rng(11 + cols);
    std::vector<WeightMatrix::Part> parts;
    std::vector<std::vector<uint8_t>> bytes(types.size());
    std::vector<double> w;  // [rows][cols], the reference dequantiser's values
    for (size_t p = 0; p < types.size(); ++p) {
        const WeightTypeTraits& t = weight_traits(types[p]);
        std::vector<uint8_t>& b = bytes[p];
        b = random_blocks(types[p], rows[p] * weight_row_bytes(t, cols) / t.block_bytes, rng);
        std::vector<float> v(static_cast<size_t>(rows[p]) * cols);
        t.dequantize(b.data(), v.data(), b.size() / t.block_bytes);
        w.insert(w.end(), v.begin(), v.end());
        parts.push_back({types[p], rows[p], b.data(), b.size()});
    }
    const WeightMatrix m(cols, parts);
    const int R = m.rows(), G = cols / kIntegerGroup;
    std::vector<uint8_t> u(static_cast<size_t>(R) * cols);
    std::vector<float> a(static_cast<size_t>(R) * G), o(static_cast<size_t>(R) * G);
    for (int r = 0; r < R; ++r)
        m.integer_row(r, 0, cols, &u[static_cast<size_t>(r) * cols], &a[static_cast<size_t>(r) * G], &o[static_cast<size_t>(r) * G]);
    const std::string name = m.type_names() + " cols " + std::to_string(cols);
    for (int n : {1, 5, 6, 9, 23})
    for (bool twice : {true, false}) {
        if (!twice && m.reads_twice_rounded()) continue;  // Q4_0 / Q4_1 rows need both roundings
        const std::vector<float> x = random_vec(rng, static_cast<size_t>(n) * cols);
        Q8Rows xq;
        xq.residual = twice;
        xq.resize(n, cols);
        xq.quantize_rows(x.data(), cols, 0, n);
        std::vector<float> ref(static_cast<size_t>(n) * R);
        multiply_batch(m, xq, 0, R, ref.data(), R, Isa::Scalar);
        double worst = 0, scale = 0, over = 0;
        for (int i = 0; i < n; ++i)
            for (int r = 0; r < R; ++r) {
                // The errors at the mean u of each group of the row's panel: 32 columns, 16 where a
                // Q6_K row shares the panel.
                const int p0 = r / 16 * 16, group = m.integer_group(p0, std::min(R, p0 + 16));
                CHECK(group == 16 || group == 32, "%s: a group of %d columns", name.c_str(), group);
                double same = 0, exact = 0, bound = 0;
                std::vector<double> mean(static_cast<size_t>(cols / group), 0.0);
                for (int c = 0; c < cols; ++c) mean[c / group] += u[static_cast<size_t>(r) * cols + c] / double(group);
                for (int c = 0; c < cols; ++c) {
                    const size_t rc = static_cast<size_t>(r) * cols + c, ic = static_cast<size_t>(i) * cols + c;
                    const size_t blk = Q8Rows::value_at(i, c / 32, cols / 32), code = xq.code_at(i, c);
                    const double step = xq.steps[blk], ag = a[static_cast<size_t>(r) * G + c / kIntegerGroup];
                    double value = step * xq.codes[code], last = step;  // the rounded value, the last rounding's step
                    if (twice) {
                        last = xq.residual_steps[blk];
                        value += last * xq.residual_codes[code];
                    }
                    same += value * ag * u[rc];
                    exact += static_cast<double>(x[ic]) * w[rc];
                    bound += last / 2 * std::fabs(ag * (u[rc] - mean[c / group]));
                }
                for (int g = 0; g < G; ++g) {  // groups of 16: a and b are equal within a group of 32
                    const size_t at = Q8Rows::value_at(i, g, G), wg = static_cast<size_t>(r) * G + g;
                    same += static_cast<double>(o[wg]) * xq.sums[at] + a[wg] * mean[g * 16 / group] * xq.errors[at];
                }
                const double got = ref[static_cast<size_t>(i) * R + r];
                worst = std::max(worst, std::fabs(same - got));
                scale = std::max(scale, std::fabs(same));
                over = std::max(over, std::fabs(exact - got) - bound * (1 + 1e-3) - 1e-5 * std::fabs(exact));
            }
        CHECK(worst <= 1e-5 * scale, "%s n %d: scalar vs float64 %g of %g", name.c_str(), n, worst, scale);
        CHECK(over <= 0, "%s n %d: %g beyond the rounding's bound from the unrounded product", name.c_str(), n, over);
        for (Isa isa : kIsas) {
            std::vector<float> y(ref.size());
            multiply_batch(m, xq, 0, R, y.data(), R, isa);
            double d = 0;
            for (size_t j = 0; j < y.size(); ++j) d = std::max(d, static_cast<double>(std::fabs(y[j] - ref[j])));
            CHECK(d <= 1e-5 * scale, "%s n %d isa %s: %g from the scalar path", name.c_str(), n, isa_name(isa), d);
            // Rows in two ranges split at a panel boundary: the same bits as the whole.
            const int cut = std::min(R, 16 * ((R / 2 + 15) / 16));
            std::vector<float> z(ref.size(), -1.f);
            multiply_batch(m, xq, 0, cut, z.data(), R, isa);
            multiply_batch(m, xq, cut, R, z.data(), R, isa);
            CHECK(std::memcmp(z.data(), y.data(), y.size() * sizeof(float)) == 0, "%s n %d isa %s: a split differs",
                  name.c_str(), n, isa_name(isa));
        }
    }
    Q8Rows one, narrow;
    one.resize(1, cols);
    narrow.resize(1, cols - 32);
    std::vector<float> y(static_cast<size_t>(R) + 1);
    CHECK(throws<std::out_of_range>([&] { multiply_batch(m, one, 0, R + 1, y.data(), R + 1, Isa::Scalar); }),
          "rows past the matrix");
    CHECK(throws<std::invalid_argument>([&] { multiply_batch(m, narrow, 0, R, y.data(), R, Isa::Scalar); }),
          "an activation of another width");
    CHECK(throws<std::invalid_argument>([&] { one.resize(1, 33); }), "a width not a multiple of 32");
    Q8Rows once;
    once.residual = false;
    once.resize(1, cols);
    if (m.reads_twice_rounded())
        CHECK(throws<std::invalid_argument>([&] { multiply_batch(m, once, 0, R, y.data(), R, Isa::Scalar); }),
              "%s: an activation rounded once", name.c_str());
    else
        CHECK(once.residual_codes.empty() && once.residual_steps.empty(), "%s: rounded once holds no residual", name.c_str());
}

int main() {
    table();
    kquant_activation();
    hand_made_blocks();
    for (WeightType t : {WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K}) {
        random_matrices(t, 256);   // one super-block per row
        random_matrices(t, 1536);  // Qwen2.5-1.5B's hidden size
        random_matrices(t, 8960);  // its ffn (the down projection's columns)
    }
    for (WeightType t : {WeightType::Q5_0, WeightType::Q8_0}) {
        random_matrices(t, 32);    // one block (an odd count: the pair form's zero block)
        random_matrices(t, 896);   // Qwen2.5-0.5B's hidden size (not a multiple of 256)
        random_matrices(t, 4864);  // its ffn
    }
    stacked_parts();
    without_pair_form();
    integer_forms();
    batched_product({WeightType::Q4_K, WeightType::Q4_K, WeightType::Q6_K}, {16, 9, 12}, 512);
    batched_product({WeightType::Q5_K}, {33}, 1536);
    batched_product({WeightType::Q4_1, WeightType::Q4_0}, {20, 3}, 576);  // a last panel of 64 columns
    batched_product({WeightType::Q5_0, WeightType::Q5_0, WeightType::Q8_0}, {14, 2, 7}, 896);  // Q8_0's split panels
    batched_product({WeightType::Q8_0}, {33}, 4864);
    bad_input();
    std::printf("test_weight_matrix: %s (best isa %s)\n", g_failures ? "FAILED" : "ok", isa_name(best_isa()));
    return g_failures != 0;
}
