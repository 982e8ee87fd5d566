// The SIMD paths this build actually uses, against the scalar references:
//  - reports best_isa() and the Gear kernel set, and on AArch64 requires both to be NEON (so a
//    cross build run under qemu-aarch64 proves the NEON paths are the active ones);
//  - Gear codec loops: the compile-time set (NEON on AArch64) byte for byte against scalar::,
//    over odd sizes that exercise the vector bodies and the scalar tails;
//  - attention through KvCache::step (which uses best_isa()) against the scalar kernels, decode
//    and prefill, f16/bf16/f32;
//  - the rotation of q8r / q4r rows (rotate_rows) on every available ISA, bit for bit against
//    hadamard_rows.
// Sized to run in seconds under user-mode emulation.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "../src/codec/gear_kernels.h"
#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/cache/kv_cache.h"

#include "test_support.h"

using namespace mnn_h2o;
namespace gk = mnn_h2o::gear::kernels;

using Bytes = std::vector<uint8_t>;

static void test_active_isa() {
    const char* cap = std::getenv("MNN_H2O_ISA");
    std::printf("best_isa: %s; gear kernels: %s; MNN_H2O_ISA=%s\n", isa_name(best_isa()), gk::kIsaName,
                cap ? cap : "(unset)");
#if defined(__aarch64__)
    CHECK(cpu_features().neon, "aarch64 without NEON");
    CHECK(isa_available(Isa::Neon), "NEON kernels not compiled in");
    if (!cap) CHECK(best_isa() == Isa::Neon, "best_isa is %s on aarch64, want neon", isa_name(best_isa()));
    CHECK(std::strcmp(gk::kIsaName, "neon") == 0, "gear kernels are %s on aarch64, want neon", gk::kIsaName);
#else
    CHECK(!isa_available(Isa::Neon), "NEON available off aarch64");
#endif
}

// Plane-like bytes: runs, slowly varying exponents and noise, so every predictor and both signs
// of every field occur.
static Bytes plane_bytes(std::mt19937& g, size_t n) {
    Bytes b(n);
    std::uniform_int_distribution<int> byte(0, 255), choice(0, 3);
    uint8_t run = 0;
    for (size_t i = 0; i < n; ++i) {
        switch (choice(g)) {
            case 0: b[i] = static_cast<uint8_t>(byte(g)); break;
            case 1: b[i] = run; break;
            case 2: b[i] = static_cast<uint8_t>(0x38 + (byte(g) & 7) + (byte(g) & 0x80)); break;
            default: run = static_cast<uint8_t>(byte(g)); b[i] = run; break;
        }
    }
    return b;
}

static void test_gear_kernels() {
    std::mt19937 g(7);
    int cases = 0;
    // Element counts around the 16-byte vector width, and the cache's 64 x 64 block.
    for (size_t count : {0, 1, 15, 16, 17, 31, 64, 100, 4096, 4097}) {
        for (size_t es : {2, 4}) {
            const Bytes elems = plane_bytes(g, count * es);
            std::vector<Bytes> a(es, Bytes(count)), b(es, Bytes(count));
            uint8_t* pa[4] = {};
            uint8_t* pb[4] = {};
            for (size_t k = 0; k < es; ++k) pa[k] = a[k].data(), pb[k] = b[k].data();
            gk::split_planes(elems.data(), count, es, pa);
            gk::scalar::split_planes(elems.data(), count, es, pb);
            CHECK(a == b, "split_planes count=%zu es=%zu", count, es);
            Bytes back(count * es, 0), back_ref(count * es, 1);
            gk::merge_planes(pa, count, es, back.data());
            gk::scalar::merge_planes(pb, count, es, back_ref.data());
            CHECK(back == back_ref && back == elems, "merge_planes count=%zu es=%zu", count, es);
            ++cases;
        }
    }
    for (size_t n : {0, 1, 2, 5, 64, 513, 1030}) {
        for (size_t C : {1, 7, 16, 33, 64, 128}) {
            if (n * C > 70000) continue;
            const Bytes P = plane_bytes(g, n * C);
            const size_t total = n * C;
            for (bool use_xor : {false, true}) {
                Bytes r(total, 0), r_ref(total, 1), p(total, 2), p_ref(total, 3);
                gk::delta_forward(P.data(), n, C, use_xor, r.data());
                gk::scalar::delta_forward(P.data(), n, C, use_xor, r_ref.data());
                CHECK(r == r_ref, "delta_forward n=%zu C=%zu xor=%d", n, C, use_xor);
                gk::delta_inverse(r.data(), n, C, use_xor, p.data());
                gk::scalar::delta_inverse(r_ref.data(), n, C, use_xor, p_ref.data());
                CHECK(p == p_ref && (n == 0 || p == P), "delta_inverse n=%zu C=%zu xor=%d", n, C, use_xor);
            }
            for (uint8_t mask : {uint8_t{0x7C}, uint8_t{0x7F}}) {
                if (n == 0) continue;
                std::vector<uint64_t> sums(2 * C, 5), sums_ref(2 * C, 6);
                Bytes refs(C, 0), refs_ref(C, 1);
                gk::centre_references(P.data(), n, C, mask, sums.data(), refs.data());
                gk::scalar::centre_references(P.data(), n, C, mask, sums_ref.data(), refs_ref.data());
                CHECK(refs == refs_ref && sums == sums_ref, "centre_references n=%zu C=%zu mask=%02x", n, C, mask);
                Bytes r(total, 0), r_ref(total, 1), p(total, 2), p_ref(total, 3);
                gk::centre_forward(P.data(), n, C, refs.data(), mask, r.data());
                gk::scalar::centre_forward(P.data(), n, C, refs.data(), mask, r_ref.data());
                CHECK(r == r_ref, "centre_forward n=%zu C=%zu mask=%02x", n, C, mask);
                gk::centre_inverse(r.data(), n, C, refs.data(), mask, p.data());
                gk::scalar::centre_inverse(r.data(), n, C, refs.data(), mask, p_ref.data());
                CHECK(p == p_ref && p == P, "centre_inverse n=%zu C=%zu mask=%02x", n, C, mask);
            }
            ++cases;
        }
    }
    // count_runs: lengths around the vector width and past the 255-vector counter limit, with
    // data that has no runs (every byte differs) and data that is one run.
    for (size_t n : {0, 1, 2, 16, 17, 18, 100, 255 * 16 + 1, 255 * 16 + 2, 20000}) {
        Bytes varied = plane_bytes(g, n), alternating(n), constant(n, 0xAB);
        for (size_t i = 0; i < n; ++i) alternating[i] = static_cast<uint8_t>(i & 1);
        for (const Bytes* b : {&varied, &alternating, &constant}) {
            const size_t got = gk::count_runs(b->data(), n), want = gk::scalar::count_runs(b->data(), n);
            CHECK(got == want, "count_runs n=%zu: %zu, scalar %zu", n, got, want);
        }
        CHECK(gk::count_runs(alternating.data(), n) == n, "count_runs alternating n=%zu", n);
        ++cases;
    }
    // The histograms are shared (scalar on every ISA) but check the binding anyway.
    {
        const Bytes P = plane_bytes(g, 64 * 64);
        Bytes refs(64, 0x3C);
        static uint32_t h[4][256], h_ref[4][256];
        std::memset(h, 0, sizeof h);
        std::memset(h_ref, 0, sizeof h_ref);
        CHECK(gk::sample_histograms(P.data(), 64, 64, refs.data(), 0x7C, h) ==
                  gk::scalar::sample_histograms(P.data(), 64, 64, refs.data(), 0x7C, h_ref),
              "sample_histograms count");
        CHECK(std::memcmp(h, h_ref, sizeof h) == 0, "sample_histograms");
    }
    std::printf("gear kernels (%s vs scalar): %d cases\n", gk::kIsaName, cases);
}

// Whole-codec round trips on KV-like data through the active kernels.
static void test_codec_round_trip() {
    std::mt19937 g(9);
    std::normal_distribution<float> dist(0.f, 1.f);
    gear::Codec codec;
    for (gear::ElementType type : {gear::ElementType::F16, gear::ElementType::BF16, gear::ElementType::F32}) {
        const uint32_t tokens = 64, channels = 72;
        const size_t es = type == gear::ElementType::F32 ? 4 : 2;
        Bytes data(tokens * channels * es);
        for (uint32_t t = 0; t < tokens; ++t)
            for (uint32_t c = 0; c < channels; ++c) {
                const float x = dist(g) * (1.f + c % 5);
                uint32_t bits;
                std::memcpy(&bits, &x, 4);
                const size_t at = (static_cast<size_t>(t) * channels + c) * es;
                if (type == gear::ElementType::F32) std::memcpy(&data[at], &bits, 4);
                else {
                    // Top 16 bits: a bf16 for BF16, and an fp16-like pattern is just as good a
                    // test of the byte loops for F16.
                    const uint16_t h = static_cast<uint16_t>(bits >> 16);
                    std::memcpy(&data[at], &h, 2);
                }
            }
        Bytes frame, back(data.size());
        CHECK(codec.encode(data.data(), type, gear::Shape::matrix(tokens, channels), &frame) == gear::Status::Ok,
              "encode type=%d", static_cast<int>(type));
        CHECK(codec.decode(frame.data(), frame.size(), back.data(), back.size()) == gear::Status::Ok,
              "decode type=%d", static_cast<int>(type));
        CHECK(back == data, "round trip type=%d", static_cast<int>(type));
        std::printf("codec round trip %s: %zu -> %zu bytes\n",
                    type == gear::ElementType::F16 ? "f16" : type == gear::ElementType::BF16 ? "bf16" : "f32",
                    data.size(), frame.size());
    }
}

static double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double err = 0, mag = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
        mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
    }
    return err / mag;
}

// KvCache::step (best_isa) and attend(..., Isa::Scalar) over the same cache.
static void test_attention_vs_scalar() {
    std::mt19937 g(5);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (KvDtype dtype : {KvDtype::F16, KvDtype::BF16, KvDtype::F32}) {
        KvCacheConfig cfg;
        cfg.n_layers = 1;
        cfg.n_kv_heads = 2;
        cfg.n_heads = 6;
        cfg.head_dim = 64;
        cfg.dtype = dtype;
        cfg.block_tokens = 32;
        cfg.max_tokens = 512;
        cfg.threads = 1;
        KvCache cache(cfg);
        const int kv_row = cfg.n_kv_heads * cfg.head_dim, q_row = cfg.n_heads * cfg.head_dim;
        // A prefill of 40 tokens (tile kernels), then 3 decode steps (decode kernel).
        for (int n : {40, 1, 1, 1}) {
            std::vector<float> q(static_cast<size_t>(n) * q_row), k(static_cast<size_t>(n) * kv_row), v(k.size());
            for (float& x : q) x = dist(g);
            for (float& x : k) x = dist(g);
            for (float& x : v) x = dist(g);
            std::vector<float> out(q.size()), out_ref(q.size());
            std::vector<float> s(static_cast<size_t>(cfg.n_kv_heads) * cache.max_blocks(), 0.f), s_ref(s);
            cache.step(0, q.data(), k.data(), v.data(), n, out.data(), s.data(), cache.max_blocks());
            cache.attend(0, q.data(), n, out_ref.data(), s_ref.data(), cache.max_blocks(), Isa::Scalar);
            const double e = max_rel_err(out, out_ref), es = max_rel_err(s, s_ref);
            CHECK(e < 1e-5 && es < 1e-5, "%s %s n=%d: output rel err %.3g, block scores %.3g vs scalar",
                  isa_name(best_isa()), kv_dtype_name(dtype), n, e, es);
        }
    }
    std::printf("attention (%s vs scalar): f16, bf16, f32 prefill + decode\n", isa_name(best_isa()));
}

static void test_rotation_vs_scalar() {
    std::mt19937 g(9);
    std::normal_distribution<float> dist(0.f, 1.f);
    int isas = 0;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon}) {
        if (!isa_available(isa)) continue;
        ++isas;
        // 8 and 4 are shorter than an AVX-512 / AVX2 vector (the reference runs them); 512 is
        // longer than any head.
        for (int n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) {
            const size_t rows = 5;
            std::vector<float> x(rows * n);
            for (size_t i = 0; i < x.size(); ++i) x[i] = dist(g) * (i % 7 == 0 ? 300.f : 1.f);
            std::vector<float> want = x, got = x;
            hadamard_rows(want.data(), rows, n);
            rotate_rows(isa, got.data(), rows, n);
            CHECK(std::memcmp(want.data(), got.data(), x.size() * sizeof(float)) == 0,
                  "rotate_rows on %s, n=%d: not the reference's bits", isa_name(isa), n);
        }
    }
    bool refused = false;
    std::vector<float> x(48, 1.f);
    try {
        rotate_rows(Isa::Scalar, x.data(), 1, 48);
    } catch (const std::invalid_argument&) {
        refused = true;
    }
    CHECK(refused, "rotate_rows accepts a row of 48 (not a power of two)");
    std::printf("rotation: %d ISA(s) bit-identical to hadamard_rows\n", isas);
}

int main() {
    test_active_isa();
    test_gear_kernels();
    test_codec_round_trip();
    test_attention_vs_scalar();
    test_rotation_vs_scalar();
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all ISA parity tests passed\n");
    return 0;
}
