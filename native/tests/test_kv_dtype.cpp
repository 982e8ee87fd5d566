// The KV element types (kv_dtype.h): names, row sizes, the reference quantisation (error bounds,
// idempotence, hostile inputs), the Hadamard rotation, and a rotated cache read back through
// KvCache. The kernels that read quantised rows are checked in test_attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/cache/kv_dtype.h"

#include "test_support.h"

using namespace mnn_h2o;

static void test_names_and_sizes() {
    for (int i = 0; i < kKvDtypeCount; ++i) {
        const KvDtype dt = static_cast<KvDtype>(i);
        KvDtype back;
        CHECK(kv_dtype_from_name(kv_dtype_name(dt), &back) && back == dt, "name round trip of %d", i);
    }
    KvDtype unused;
    CHECK(!kv_dtype_from_name("int8", &unused) && !kv_dtype_from_name("", &unused), "unknown names refused");
    CHECK(!kv_dtype_valid(-1) && !kv_dtype_valid(kKvDtypeCount), "valid range");
    CHECK(kv_dtype_names() == "f16, bf16, f32, q8, q4, q4r, q8r", "names: %s", kv_dtype_names().c_str());
    // head_dim 64: the model's rows. q8 must beat 1.85x of f16 (docs/kv_cache.md).
    CHECK(kv_row_bytes(KvDtype::F16, 64) == 128 && kv_row_bytes(KvDtype::BF16, 64) == 128 &&
              kv_row_bytes(KvDtype::F32, 64) == 256,
          "float rows");
    CHECK(kv_row_bytes(KvDtype::Q8, 64) == 68, "q8 row %zu", kv_row_bytes(KvDtype::Q8, 64));
    CHECK(kv_row_bytes(KvDtype::Q4, 64) == 36 && kv_row_bytes(KvDtype::Q4R, 64) == 36, "q4 rows");
    CHECK(kv_dtype_shape_error(KvDtype::Q8, 48) != "", "q8 needs whole groups");
    CHECK(kv_dtype_shape_error(KvDtype::Q4R, 96) != "" && kv_dtype_shape_error(KvDtype::Q8R, 96) != "" &&
              kv_dtype_shape_error(KvDtype::Q4, 96) == "",
          "rotated types need a power of two");
    CHECK(kv_row_bytes(KvDtype::Q8R, 64) == 68 && kv_storage_dtype(KvDtype::Q8R) == KvDtype::Q8, "q8r rows");
    CHECK(kv_dtype_shape_error(KvDtype::F16, 48) == "", "float types take any head_dim");
    CHECK(kv_storage_dtype(KvDtype::Q4R) == KvDtype::Q4 && kv_dtype_rotated(KvDtype::Q4R) &&
              !kv_dtype_rotated(KvDtype::Q4) && kv_dtype_quantised(KvDtype::Q8) && !kv_dtype_quantised(KvDtype::BF16),
          "traits");
}

// Each element comes back within half a step of its group's stored scale, and (q8) quantising
// what came back gives the same bytes again.
static void test_quantisation_bounds() {
    std::mt19937 rng(7);
    const int hd = 128;
    for (KvDtype dt : {KvDtype::Q8, KvDtype::Q4}) {
        const size_t rb = kv_row_bytes(dt, hd), codes = dt == KvDtype::Q8 ? hd : hd / 2;
        const float max_code = dt == KvDtype::Q8 ? 127.f : 7.f;
        for (float mag : {1e-6f, 1e-3f, 1.f, 30.f, 5000.f}) {
            std::normal_distribution<float> dist(0.f, mag);
            const size_t n_rows = 50;
            std::vector<float> x(n_rows * hd), y(x.size()), z(x.size());
            for (float& e : x) e = dist(rng);
            x[5] = 0.f;
            for (int d = 0; d < kKvQuantGroup; ++d) x[hd + d] = 0.f;  // an all-zero group
            std::vector<uint8_t> q(n_rows * rb), q2(q.size());
            kv_rows_from_f32(dt, x.data(), q.data(), n_rows, hd);
            kv_rows_to_f32(dt, q.data(), y.data(), n_rows, hd);
            size_t bad = 0;
            for (size_t r = 0; r < n_rows; ++r) {
                for (int g = 0; g < hd / kKvQuantGroup; ++g) {
                    uint16_t bits;
                    std::memcpy(&bits, q.data() + r * rb + codes + 2 * g, 2);
                    const float scale = fp16_to_fp32(bits);
                    float amax = 0.f;
                    for (int d = 0; d < kKvQuantGroup; ++d) amax = std::max(amax, std::fabs(x[r * hd + g * kKvQuantGroup + d]));
                    // The stored scale is amax / max_code rounded to fp16 (relative error 2^-11,
                    // or half a subnormal step, 2^-25, for tiny groups).
                    bad += std::fabs(scale - amax / max_code) > amax / max_code * 1e-3f + 3e-8f;
                    // Half a step, plus what a scale rounded down clips off the largest element.
                    const float bound = 0.5f * scale * 1.002f + std::max(0.f, amax - scale * max_code) + 1e-12f;
                    for (int d = 0; d < kKvQuantGroup; ++d) {
                        const size_t i = r * hd + g * kKvQuantGroup + d;
                        bad += !(std::fabs(y[i] - x[i]) <= bound);
                    }
                }
            }
            CHECK(bad == 0, "%s magnitude %g: %zu elements or scales out of bounds", kv_dtype_name(dt), mag, bad);
            // q8's codes stay inside +-127, so its rows are a fixed point; q4 can round to -8,
            // whose group then gets a new scale when quantised again.
            if (dt != KvDtype::Q8) continue;
            kv_rows_from_f32(dt, y.data(), q2.data(), n_rows, hd);
            CHECK(q == q2, "%s magnitude %g: quantising the dequantised rows changes bytes", kv_dtype_name(dt), mag);
            kv_rows_to_f32(dt, q2.data(), z.data(), n_rows, hd);
            CHECK(y == z, "%s: dequantisation is not deterministic", kv_dtype_name(dt));
        }
    }
}

// The codes are round-to-nearest-even of x / scale clamped to the code range, as std::nearbyint
// computes it, for every element: ties (odd and even halves, both signs), values just beside
// them, the clamp, zero groups, tiny and huge groups and NaN.
static void test_codes_round_to_nearest_even() {
    const int hd = 64;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> unit(-1.f, 1.f);
    for (KvDtype dt : {KvDtype::Q8, KvDtype::Q4}) {
        const size_t rb = kv_row_bytes(dt, hd), codes = dt == KvDtype::Q8 ? hd : hd / 2;
        const float max_code = dt == KvDtype::Q8 ? 127.f : 7.f, lo = dt == KvDtype::Q8 ? -127.f : -8.f;
        size_t bad = 0, rows = 0, ties = 0;
        for (int trial = 0; trial < 4000; ++trial) {
            std::vector<float> x(hd);
            // A group whose largest element is mag = max_code * 2^e has the scale 2^e exactly (e
            // down to fp16's smallest subnormal), so half steps of it are exact ties; every third
            // group has some other scale.
            const float step = std::ldexp(1.f, trial % 40 - 24) * (trial % 3 == 2 ? 1.f + 0.37f * unit(rng) : 1.f);
            const float mag = max_code * step;
            for (int d = 0; d < hd; ++d) {
                // Half steps inside +-(max_code - 1), exact or one float beside, or anywhere.
                const float v = std::round(unit(rng) * (max_code - 1.f) * 2.f) * 0.5f * step;
                switch (d % 4) {
                    case 0: x[d] = v; break;
                    case 1: x[d] = std::nextafter(v, 0.f); break;
                    case 2: x[d] = std::nextafter(v, 2.f * v + 1.f); break;
                    default: x[d] = unit(rng) * mag;
                }
            }
            x[0] = mag;
            x[32] = -mag;
            if (trial % 97 == 0) x[7] = std::numeric_limits<float>::quiet_NaN();
            std::vector<uint8_t> q(rb);
            kv_rows_from_f32(dt, x.data(), q.data(), 1, hd);
            ++rows;
            for (int g = 0; g < hd / kKvQuantGroup; ++g) {
                uint16_t bits;
                std::memcpy(&bits, q.data() + codes + 2 * g, 2);
                const float scale = fp16_to_fp32(bits), inv = scale > 0.f ? 1.f / scale : 0.f;
                for (int d = g * kKvQuantGroup; d < (g + 1) * kKvQuantGroup; ++d) {
                    const int want = static_cast<int>(std::fmin(std::fmax(std::nearbyint(x[d] * inv), lo), max_code));
                    const int got = dt == KvDtype::Q8 ? static_cast<int8_t>(q[d])
                                                      : ((q[d / 2] >> (4 * (d % 2))) & 0xF) - 8;
                    bad += got != want;
                    const float r = x[d] * inv;
                    ties += std::fabs(r - std::trunc(r)) == 0.5f;
                }
            }
        }
        CHECK(bad == 0, "%s: %zu codes differ from nearbyint's over %zu rows", kv_dtype_name(dt), bad, rows);
        CHECK(ties > 10000, "%s: only %zu exact ties tested", kv_dtype_name(dt), ties);
    }
}

// inf, NaN, huge and subnormal inputs: finite outputs, no undefined behaviour (UBSan checks the
// float -> int conversions).
static void test_hostile_inputs() {
    const int hd = 64;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x(hd, 0.5f);
    x[0] = inf;
    x[1] = -inf;
    x[2] = nan;
    x[33] = 3e38f;
    x[34] = 1e-42f;
    for (KvDtype dt : {KvDtype::Q8, KvDtype::Q4}) {
        std::vector<uint8_t> q(kv_row_bytes(dt, hd));
        std::vector<float> y(hd);
        kv_rows_from_f32(dt, x.data(), q.data(), 1, hd);
        kv_rows_to_f32(dt, q.data(), y.data(), 1, hd);
        bool finite = true;
        for (float e : y) finite = finite && std::isfinite(e);
        CHECK(finite, "%s: non-finite output from hostile input", kv_dtype_name(dt));
        CHECK(y[0] > 0.f && y[1] < 0.f && y[33] > 1e5f, "%s: saturation keeps signs (%g %g %g)", kv_dtype_name(dt),
              y[0], y[1], y[33]);
    }
}

static void test_hadamard() {
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (int n : {16, 32, 64, 128, 256}) {
        std::vector<float> x(3 * static_cast<size_t>(n)), y;
        for (float& e : x) e = dist(rng);
        y = x;
        hadamard_rows(y.data(), 3, n);
        // Against the matrix itself in float64: H[i][j] = (-1)^popcount(i & j) / sqrt(n).
        double worst = 0;
        for (int r = 0; r < 3; ++r)
            for (int i = 0; i < n; ++i) {
                double want = 0;
                for (int j = 0; j < n; ++j)
                    want += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[static_cast<size_t>(r) * n + j];
                want /= std::sqrt(double(n));
                worst = std::max(worst, std::fabs(want - y[static_cast<size_t>(r) * n + i]));
            }
        CHECK(worst < 1e-5 * std::sqrt(double(n)), "n=%d: %g from the float64 product", n, worst);
        double nx = 0, ny = 0, err = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            nx += double(x[i]) * x[i];
            ny += double(y[i]) * y[i];
        }
        hadamard_rows(y.data(), 3, n);
        for (size_t i = 0; i < x.size(); ++i) err = std::max(err, std::fabs(double(y[i]) - x[i]));
        CHECK(std::fabs(nx - ny) < 1e-4 * nx, "n=%d: rotation changes the norm", n);
        CHECK(err < 1e-5, "n=%d: rotating twice is not the identity (%g)", n, err);
    }
    // One spike spreads evenly: the point of rotating before 4-bit rounding.
    std::vector<float> spike(64, 0.f);
    spike[9] = 8.f;
    hadamard_rows(spike.data(), 1, 64);
    bool even = true;
    for (float e : spike) even = even && std::fabs(std::fabs(e) - 1.f) < 1e-6f;
    CHECK(even, "a spike of 8 becomes +-1 everywhere");
}

// A q4r cache reads back close to what went in (the rotation undone), better than q4 on rows
// with an outlier channel, and a q8 cache within q8's bound.
static void test_cache_read_back() {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.f, 1.f);
    const int hd = 64, n_kv = 2, n = 100;
    std::vector<float> k(static_cast<size_t>(n) * n_kv * hd), v(k.size());
    for (float& e : k) e = dist(rng);
    for (float& e : v) e = dist(rng);
    for (int t = 0; t < n; ++t) k[static_cast<size_t>(t) * n_kv * hd + 7] = 40.f;  // an outlier channel, head 0
    double err[kKvDtypeCount] = {};
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8, KvDtype::Q4, KvDtype::Q4R, KvDtype::Q8R}) {
        KvCache cache(kv_config(1, n_kv, hd, n_kv * 2, dt, 16, 256, 1));
        cache.append(0, k.data(), v.data(), n);
        CHECK(cache.bytes_held() == size_t{2} * n_kv * 7 * ((16 * kv_row_bytes(dt, hd) + 63) / 64 * 64),
              "%s: bytes held %zu", kv_dtype_name(dt), cache.bytes_held());
        const EvictionStats st = cache.eviction_stats();
        CHECK(st.bytes_f16 == size_t{2} * n * n_kv * hd * 2, "%s: f16 bytes", kv_dtype_name(dt));
        std::vector<float> rk(static_cast<size_t>(n) * hd), rv(rk.size());
        cache.read(0, 0, rk.data(), rv.data());
        double e = 0, ev = 0, vv = 0;
        for (int t = 0; t < n; ++t)
            for (int d = 0; d < hd; ++d) {
                e += std::pow(rk[t * hd + d] - k[static_cast<size_t>(t) * n_kv * hd + d], 2);
                ev += std::pow(rv[t * hd + d] - v[static_cast<size_t>(t) * n_kv * hd + d], 2);
                vv += std::pow(v[static_cast<size_t>(t) * n_kv * hd + d], 2);
            }
        err[static_cast<int>(dt)] = std::sqrt(e / (n * hd));
        // Values have no outlier: every type reads them back within its own step size.
        const double v_err = std::sqrt(ev / vv),
                     v_bound = dt == KvDtype::F16 ? 1e-3 : kv_storage_dtype(dt) == KvDtype::Q8 ? 0.02 : 0.2;
        CHECK(v_err < v_bound, "%s: values read back with relative rms error %.4f", kv_dtype_name(dt), v_err);
    }
    std::printf("read-back rms error, keys with an outlier channel: f16 %.4f q8 %.4f q8r %.4f q4 %.4f q4r %.4f\n",
                err[0], err[3], err[6], err[4], err[5]);
    CHECK(err[0] < 1e-2 && err[3] < 0.1, "f16/q8 read back");
    CHECK(err[5] < 0.5 * err[4] && err[6] < 0.5 * err[3], "rotation should at least halve the error on an outlier channel");
}

int main() {
    test_names_and_sizes();
    test_quantisation_bounds();
    test_codes_round_to_nearest_even();
    test_hostile_inputs();
    test_hadamard();
    test_cache_read_back();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all kv dtype tests passed\n");
    return 0;
}
