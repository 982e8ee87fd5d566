// One file: one ctest program for the codec; its allocation counter replaces operator new.
// Tests of the Gear codec: hand-built frames from docs/gear_format.md, bit-exact round trips of
// every kind of value and shape (float elements and the cache's quantised rows), the rANS backend on its own (round trips of every kind of byte
// distribution, malformed payloads), damaged and truncated frames, the no-zstd fallback (in a
// child process), and no allocation on the hot path.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <initializer_list>
#include <vector>

#include "../src/codec/gear_rans.h"
#include "mnn_h2o/cache/kv_dtype.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/codec/xxhash64.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::gear;

// Counts operator new calls, to check that a warm Codec does not allocate.
static size_t g_allocations = 0;
void* operator new(size_t n) {
    ++g_allocations;
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace {

using Bytes = std::vector<uint8_t>;

void put32(Bytes& b, uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
void put64(Bytes& b, uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); }

// A frame header as the format document lays it out.
Bytes header(uint8_t type, std::vector<uint32_t> dims, uint32_t block_tokens, const Bytes& data) {
    Bytes b = {0x47, 0x45, 0x41, 0x52, 1, type, uint8_t(dims.size()), 0};
    put32(b, block_tokens);
    for (uint32_t d : dims) put32(b, d);
    put64(b, xxh64(data.data(), data.size()));
    put32(b, uint32_t(xxh64(b.data(), b.size())));
    return b;
}

void stream(Bytes& b, uint8_t predictor, uint8_t backend, uint32_t raw_len, const Bytes& payload) {
    b.push_back(predictor);
    b.push_back(backend);
    put32(b, raw_len);
    put32(b, uint32_t(payload.size()));
    b.insert(b.end(), payload.begin(), payload.end());
}

Status decode(Codec& c, const Bytes& frame, Bytes* out) {
    FrameInfo fi;
    Status s = read_frame_info(frame.data(), frame.size(), &fi);
    if (s != Status::Ok) return s;
    out->assign(fi.decoded_size, 0);
    return c.decode(frame.data(), frame.size(), out->data(), out->size());
}

void test_xxh64() {
    CHECK(xxh64("", 0) == 0xEF46DB3751D8E999ull, "in %s", __func__);
    CHECK(xxh64("a", 1) == 0xD24EC4F1A98C6E5Bull, "in %s", __func__);
    CHECK(xxh64("abc", 3) == 0x44BC2CF5AD770999ull, "in %s", __func__);
    const char* s = "Nobody inspects the spammish repetition";
    CHECK(xxh64(s, std::strlen(s)) == 0xFBCEA83C8A378BF1ull, "in %s", __func__);
}

// The example of docs/gear_format.md, byte for byte.
void test_document_example() {
    const Bytes data = {0x00, 0x3C, 0x00, 0xC0, 0x00, 0x3C, 0x00, 0xC0};  // [[1, -2], [1, -2]]
    Bytes f = header(1, {2, 2}, 2, data);
    CHECK(f.size() == 32, "in %s", __func__);
    f.push_back(0);
    stream(f, 0, 0, 4, {0x00, 0x00, 0x00, 0x00});
    stream(f, 0, 0, 4, {0x3C, 0xC0, 0x3C, 0xC0});
    Codec c;
    Bytes out;
    CHECK(decode(c, f, &out) == Status::Ok, "in %s", __func__);
    CHECK(out == data, "in %s", __func__);
}

// Every predictor and backend, written by hand: plane 0 delta + RLE, plane 1 centre + stored,
// then the same data as a dedup slice.
void test_hand_built_predictors() {
    // FP16 [4][2]: column 0 counts 1, 2, 3, 4 in the low byte; column 1 is -2.0 then 4.0.
    const uint16_t v[8] = {0x3C01, 0xC000, 0x3C02, 0xC000, 0x3C03, 0x4400, 0x3C04, 0x4400};
    Bytes data(16);
    std::memcpy(data.data(), v, 16);
    Bytes f = header(1, {4, 2}, 4, data);
    f.push_back(0);
    // Low bytes 01 00 02 00 03 00 04 00; delta along tokens: 01 00 01 00 01 00 01 00; that
    // as RLE: a literal run of 8 bytes.
    stream(f, 2, 1, 8, {0x07, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00});
    // High bytes 3C C0 3C C0 3C 44 3C 44; refs 3C, 40 (sign +, exponent field 0x40): residuals
    // column 0: 00 each; column 1: C0 -> 80 (sign flipped, field 0), 44 -> 04.
    stream(f, 3, 0, 10, {0x3C, 0x40, 0x00, 0x80, 0x00, 0x80, 0x00, 0x04, 0x00, 0x04});
    Codec c;
    Bytes out;
    CHECK(decode(c, f, &out) == Status::Ok, "in %s", __func__);
    CHECK(out == data, "in %s", __func__);

    // Rows 0 and 2 equal, 1 and 3 equal: map 0 1 0 1 (w = 1), unique rows 3C01 C000 | 3C02 C000,
    // plane 0 with xor, plane 1 with RLE.
    const uint16_t d[8] = {0x3C01, 0xC000, 0x3C02, 0xC000, 0x3C01, 0xC000, 0x3C02, 0xC000};
    std::memcpy(data.data(), d, 16);
    f = header(1, {4, 2}, 64, data);
    f.push_back(1);
    stream(f, 0, 0, 4, {0, 1, 0, 1});
    stream(f, 1, 0, 4, {0x01, 0x00, 0x03, 0x00});  // xor: 01 00, 02^01 00^00
    stream(f, 0, 1, 4, {0x03, 0x3C, 0xC0, 0x3C, 0xC0});  // RLE: a literal run of 4
    CHECK(decode(c, f, &out) == Status::Ok, "in %s", __func__);
    CHECK(out == data, "in %s", __func__);
    // A map that is not in first-occurrence order is rejected.
    Bytes bad = f;
    bad[33 + 10] = 1;  // map 1 1 0 1
    CHECK(decode(c, bad, &out) == Status::Corrupt, "in %s", __func__);
}

// Two slices with the same repeats: the second shares the first's map (slice flags 3), and the
// decoder refuses flag 3 where there is no map to share.
void test_shared_map() {
    // FP16 [2][4][1]: slice 0 is 1 2 1 2, slice 1 is 3 4 3 4 (both map 0 1 0 1).
    const uint16_t v[8] = {0x3C00, 0x4000, 0x3C00, 0x4000, 0x4200, 0x4400, 0x4200, 0x4400};
    Bytes data(16);
    std::memcpy(data.data(), v, 16);
    const auto frame = [&](uint8_t flags0, uint8_t flags1) {
        Bytes f = header(1, {2, 4, 1}, 64, data);
        f.push_back(flags0);
        if (flags0 & 1) stream(f, 0, 0, 4, {0, 1, 0, 1});
        if (flags0 & 1) {
            stream(f, 0, 0, 2, {0x00, 0x00});
            stream(f, 0, 0, 2, {0x3C, 0x40});
        } else {
            stream(f, 0, 0, 4, {0x00, 0x00, 0x00, 0x00});
            stream(f, 0, 0, 4, {0x3C, 0x40, 0x3C, 0x40});
        }
        f.push_back(flags1);
        stream(f, 0, 0, 2, {0x00, 0x00});
        stream(f, 0, 0, 2, {0x42, 0x44});
        return f;
    };
    Codec c;
    Bytes out;
    CHECK(decode(c, frame(1, 3), &out) == Status::Ok && out == data, "in %s", __func__);
    CHECK(decode(c, frame(0, 3), &out) == Status::Corrupt, "no map before: in %s", __func__);
    CHECK(decode(c, frame(1, 2), &out) == Status::Corrupt, "shared map without dedup: in %s", __func__);
    CHECK(decode(c, frame(1, 7), &out) == Status::Corrupt, "unknown flag: in %s", __func__);
    Bytes first = header(1, {2, 4, 1}, 64, data);
    first.push_back(3);  // the first slice has nothing to share
    CHECK(decode(c, first, &out) == Status::Corrupt, "in %s", __func__);
    // The encoder writes the map once: two heads of 8 tokens x 4 channels, rows A B A B ...
    std::vector<uint16_t> heads(2 * 8 * 4);
    for (size_t i = 0; i < heads.size(); ++i) heads[i] = static_cast<uint16_t>(0x3C00 + (i / 32) * 64 + (i / 4 % 2) * 8 + i % 4);
    data.assign(heads.size() * 2, 0);
    std::memcpy(data.data(), heads.data(), data.size());
    Bytes enc;
    CHECK(c.encode(data.data(), ElementType::F16, Shape{3, {2, 8, 4}}, &enc) == Status::Ok, "in %s", __func__);
    FrameInfo fi;
    std::vector<StreamInfo> st;
    CHECK(c.inspect(enc.data(), enc.size(), &fi, &st) == Status::Ok, "in %s", __func__);
    int maps = 0, shared = 0;
    for (const StreamInfo& s : st)
        if (s.block < 0) (s.raw_len ? maps : shared) += 1;
    CHECK(maps == 1 && shared == 1, "maps %d shared %d in %s", maps, shared, __func__);
    CHECK(decode(c, enc, &out) == Status::Ok && out == data, "in %s", __func__);
}

// The rANS example of docs/gear_format.md: [1, 1, 1, -1] with plane 1 coded by rANS.
const Bytes kRansExamplePayload = {
    0x02,                                      // mode: P = 2, G = 1
    0xF4, 0x00, 0x7C, 0x02, 0x3C, 0x23, 0x05,  // table: b 0, k 1; runs 60 0 126 0 66; deltas 4 1
    0x55, 0x55, 0x01, 0x00, 0x55, 0x55, 0x01, 0x00, 0x55, 0x55, 0x01, 0x00,  // x[0..2] = 87381
    0x03, 0x00, 0x04, 0x00,                                                  // x[3] = 262147
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00};

Bytes rans_example_frame(const Bytes& payload) {
    const Bytes data = {0x00, 0x3C, 0x00, 0x3C, 0x00, 0x3C, 0x00, 0xBC};
    Bytes f = header(1, {4, 1}, 4, data);
    f.push_back(0);
    stream(f, 0, 0, 4, {0, 0, 0, 0});
    stream(f, 0, 3, 4, payload);
    return f;
}

void test_rans_document_example() {
    Codec c;
    Bytes out;
    CHECK(kRansExamplePayload.size() == 40, "in %s", __func__);
    CHECK(decode(c, rans_example_frame(kRansExamplePayload), &out) == Status::Ok, "in %s", __func__);
    CHECK(out == Bytes({0x00, 0x3C, 0x00, 0x3C, 0x00, 0x3C, 0x00, 0xBC}), "in %s", __func__);
    FrameInfo fi;
    std::vector<StreamInfo> st;
    const Bytes f = rans_example_frame(kRansExamplePayload);
    CHECK(c.inspect(f.data(), f.size(), &fi, &st) == Status::Ok && st.size() == 2 && st[1].backend == Backend::Rans,
          "in %s", __func__);
}

// Builds rANS payloads field by field (LSB-first bits), to break them one field at a time.
struct PayloadBuilder {
    Bytes bytes;
    uint64_t acc = 0;
    int fill = 0;
    void bits(uint32_t v, int n) {
        for (int i = 0; i < n; ++i) {
            acc |= uint64_t((v >> i) & 1) << fill;
            if (++fill == 8) bytes.push_back(uint8_t(acc)), acc = 0, fill = 0;
        }
    }
    void eg(uint32_t v, int k) {
        int n = 0;
        while (((v >> k) + 1) >> (n + 1)) ++n;
        bits((1u << n) - 1, n + 1);
        bits(v - (((1u << n) - 1) << k), n + k);
    }
    void align() {
        if (fill) bits(0, 8 - fill);
    }
    void u32(uint32_t v) { put32(bytes, v); }
};

// A payload for the symbols 10 (x 3) and 20 (x 1) with P = 2: 3 states that decode one 10 each and
// one that decodes 20, as in the document's example; `mutate` changes one field.
Bytes two_symbol_payload(int mutate) {
    PayloadBuilder p;
    // 1: bits 6-7 set; 2: G = 2, and the ids byte is the table's first; 5: P = 1
    p.bytes.push_back(mutate == 1 ? 0x42 : mutate == 2 ? 0x12 : mutate == 5 ? 0x01 : 0x02);
    p.bits(0, 2);                                                       // b = 0
    p.bits(1, 2);                                                       // k = 1
    p.eg(10, 2);                                                        // 10 absent
    p.eg(0, 2);                                                         // 10 present
    p.eg(8, 2);                                                         // 11..19 absent
    p.eg(0, 2);                                                         // 20 present
    p.eg(mutate == 3 ? 236 : 234, 2);                                   // 21..255 absent (3: past 255)
    p.eg(mutate == 4 ? 8 : 4, 1);        // level 2 (4: level 4, value 8 > M)
    p.eg(mutate == 5 ? 0 : 1, 1);        // level 1 (5: level 2 too, so 10 is the remainder, and
                                         // with M = 2 the other frequency leaves it nothing)
    if (mutate == 6) p.bits(1, 1);       // a padding bit set
    p.align();
    const uint32_t x10 = 87381, x20 = 262147, L = 1u << 16;
    p.u32(x10), p.u32(x10), p.u32(x10), p.u32(mutate == 7 ? 0xFFFF : x20);  // 7: state below L
    for (int j = 4; j < 8; ++j) p.u32(mutate == 8 ? L + 4 : L);             // 8: final state not L
    if (mutate == 9) p.bytes.push_back(0), p.bytes.push_back(0);             // a word left over
    return p.bytes;
}

void test_rans_malformed_payloads() {
    rans::Decoder d;
    uint8_t out[8];
    const Bytes good = two_symbol_payload(0);
    CHECK(d.decode(good.data(), good.size(), out, 4, 1), "in %s", __func__);
    CHECK(out[0] == 10 && out[1] == 10 && out[2] == 10 && out[3] == 20, "in %s", __func__);
    for (int m = 1; m <= 9; ++m) {
        const Bytes bad = two_symbol_payload(m);
        CHECK(!d.decode(bad.data(), bad.size(), out, 4, 1), "mutation %d accepted", m);
    }
    // More symbols than the states and words hold: the words run out.
    CHECK(!d.decode(good.data(), good.size(), out, 5, 1), "in %s", __func__);
    CHECK(!d.decode(good.data(), good.size(), out, 3, 1), "in %s", __func__);  // final state not L
    for (size_t n = 0; n < good.size(); ++n) CHECK(!d.decode(good.data(), n, out, 4, 1), "cut at %zu", n);

    // Groups: ids must be below G, and the bits past the last column zero.
    auto grouped = [](uint8_t ids, int columns) {
        PayloadBuilder p;
        p.bytes.push_back(0x12);  // P = 2, G = 2
        for (int i = 0; i < (columns + 3) / 4; ++i) p.bytes.push_back(ids);
        for (int t = 0; t < 2; ++t) {  // two tables: symbol 10 alone (f = M)
            p.bits(0, 2), p.bits(0, 2), p.eg(10, 2), p.eg(0, 2), p.eg(244, 2), p.eg(2, 0);
        }
        p.align();
        for (int j = 0; j < 8; ++j) p.u32(1u << 16);
        return p.bytes;
    };
    Bytes g = grouped(0x04, 2);  // columns 0, 1 in tables 0, 1
    CHECK(d.decode(g.data(), g.size(), out, 8, 2), "in %s", __func__);
    g = grouped(0x08, 2);  // column 1 in table 2 of 2
    CHECK(!d.decode(g.data(), g.size(), out, 8, 2), "in %s", __func__);
    g = grouped(0x14, 2);  // a bit set past column 1
    CHECK(!d.decode(g.data(), g.size(), out, 8, 2), "in %s", __func__);
    // In a frame, a broken payload is a corrupt stream.
    Codec c;
    Bytes o;
    CHECK(decode(c, rans_example_frame(two_symbol_payload(8)), &o) == Status::Corrupt, "in %s", __func__);
}

// Round trips of the backend alone: plan, encode within the estimate, decode.
bool rans_round_trip(rans::Encoder& e, rans::Decoder& d, const Bytes& data, size_t columns,
                     uint32_t* tables = nullptr) {
    const size_t estimate = e.plan(data.data(), data.size(), columns);
    if (data.empty()) return estimate == SIZE_MAX;
    Bytes payload(2 * data.size() + 4096), out(data.size());
    const size_t n = e.encode(data.data(), data.size(), columns, payload.data(), payload.size());
    if (tables) *tables = e.planned_tables();
    // The estimate is the size to a few bytes (the final states, the log2 approximation).
    const size_t slack = std::max<size_t>(16, n / 256);
    if (n == 0 || n + slack < estimate || n > estimate + slack) {
        std::fprintf(stderr, "rans: %zu bytes, estimate %zu\n", n, estimate);
        return false;
    }
    if (!d.decode(payload.data(), n, out.data(), out.size(), columns) || out != data) return false;
    // Nothing short of the whole payload decodes.
    return !d.decode(payload.data(), n - 1, out.data(), out.size(), columns);
}

void test_rans_round_trips() {
    std::mt19937 g(21);
    rans::Encoder e;
    rans::Decoder d;
    auto fill = [&](size_t n, auto draw) {
        Bytes b(n);
        for (auto& v : b) v = uint8_t(draw());
        return b;
    };
    std::geometric_distribution<int> geo(0.3);
    const std::vector<std::pair<const char*, Bytes>> cases = {
        {"empty", {}},
        {"one byte", {0x42}},
        {"single symbol", Bytes(5000, 7)},
        {"two symbols", fill(3000, [&] { return g() % 16 ? 1 : 200; })},
        {"uniform 256", fill(20000, [&] { return g(); })},
        {"every value once", fill(256, [&, v = 0]() mutable { return v++; })},
        {"skewed", fill(10000, [&] { return std::min(geo(g), 255); })},
        {"skewed 256", fill(70000, [&] { return g() % 8 ? std::min(geo(g), 255) : int(g() % 256); })},
        {"short", fill(9, [&] { return g() % 5; })},
    };
    for (const auto& [name, data] : cases) {
        for (size_t columns : {size_t{1}, size_t{3}, size_t{64}}) {
            const bool ok = rans_round_trip(e, d, data, columns);
            if (!ok) std::fprintf(stderr, "rans round trip failed: %s, %zu columns\n", name, columns);
            CHECK(ok, "in %s", __func__);
        }
    }
    // Columns of two kinds: on 300 rows the encoder uses several tables, which must decode per
    // column (with a multiple of 8 columns or not); on 100 rows it does not try.
    for (size_t columns : {size_t{2}, size_t{7}, size_t{64}, size_t{130}}) {
        for (size_t rows : {size_t{300}, size_t{100}}) {
            Bytes data(columns * rows);
            for (size_t i = 0; i < data.size(); ++i)
                data[i] = uint8_t(i % columns % 2 ? std::min(geo(g), 255) : 128 + g() % 64);
            uint32_t tables = 0;
            CHECK(rans_round_trip(e, d, data, columns, &tables) && (tables > 1) == (rows == 300),
                  "in %s: %zu columns, %zu rows, %u tables", __func__, columns, rows, tables);
        }
    }
}

// Frames the encoder never writes but the format allows: every predictor on empty planes.
void test_empty_planes() {
    Codec c;
    Bytes out;
    for (uint8_t p : {0, 1, 2, 3}) {
        Bytes f = header(1, {16, 0}, 16, {});
        f.push_back(0);
        stream(f, 0, 0, 0, {});
        stream(f, p, 0, 0, {});
        CHECK(decode(c, f, &out) == Status::Ok, "in %s", __func__);
        CHECK(out.empty(), "in %s", __func__);
    }
}

uint32_t rnd32(std::mt19937& g) { return g(); }

// Values of every class, as bit patterns of the (float) element type.
Bytes special_values(ElementType t, size_t count, std::mt19937& g) {
    const size_t es = t == ElementType::F32 ? 4 : 2;
    Bytes b(count * es);
    const uint32_t f16[] = {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE5A, 0x0001, 0x83FF, 0x3C00, 0x7BFF};
    const uint32_t b16[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFA5, 0x0001, 0x807F, 0x3F80};
    const uint32_t f32[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                            0xFFABCDEF, 0x00000001, 0x807FFFFF, 0x3F800000};
    for (size_t i = 0; i < count; ++i) {
        uint32_t v = rnd32(g);
        if (v % 4 == 0) {  // a quarter special values, the rest random bit patterns
            if (t == ElementType::F16) v = f16[(v >> 8) % (sizeof f16 / 4)];
            else if (t == ElementType::BF16) v = b16[(v >> 8) % (sizeof b16 / 4)];
            else v = f32[(v >> 8) % (sizeof f32 / 4)];
        }
        std::memcpy(&b[i * es], &v, es);
    }
    return b;
}

// KV-like FP16: per-channel scales over four orders of magnitude, some repeated rows.
Bytes kv_like(size_t tokens, size_t channels, std::mt19937& g, bool repeat_rows) {
    std::normal_distribution<float> nd;
    std::vector<float> scale(channels);
    for (auto& s : scale) s = std::pow(10.f, std::uniform_real_distribution<float>(-2, 2)(g));
    Bytes b(tokens * channels * 2);
    for (size_t t = 0; t < tokens; ++t) {
        if (repeat_rows && t >= 4 && g() % 3 == 0) {
            std::memcpy(&b[t * channels * 2], &b[(g() % t) * channels * 2], channels * 2);
            continue;
        }
        for (size_t c = 0; c < channels; ++c) {
            const float x = nd(g) * scale[c];
            // float -> half by truncation: good enough for test data.
            uint32_t u;
            std::memcpy(&u, &x, 4);
            const int e = int((u >> 23) & 0xFF) - 127 + 15;
            uint16_t h = uint16_t((u >> 16) & 0x8000);
            if (e > 0 && e < 31) h |= uint16_t(e << 10 | ((u >> 13) & 0x3FF));
            std::memcpy(&b[(t * channels + c) * 2], &h, 2);
        }
    }
    return b;
}

// FP16 [256][16] whose high bytes cycle through 5 rows while the low bytes are random: no row
// repeats whole (no dedup), but the top plane is long repeats, which only zstd finds.
Bytes repeating_top_rows(std::mt19937& g) {
    Bytes b(256 * 16 * 2);
    for (size_t i = 0; i < b.size(); i += 2) {
        b[i] = uint8_t(g());
        b[i + 1] = uint8_t(0x30 + (i / 2 % (16 * 5)) * 7 % 23);
    }
    return b;
}

bool round_trip(Codec& c, ElementType t, const Shape& shape, const Bytes& data, Bytes* frame) {
    if (c.encode(data.data(), t, shape, frame) != Status::Ok) return false;
    if (frame->size() > max_encoded_size(t, shape, c.options().block_tokens)) return false;
    Bytes out;
    if (decode(c, *frame, &out) != Status::Ok) return false;
    return out == data;
}

void test_round_trips() {
    std::mt19937 g(1234);
    const std::vector<std::vector<uint32_t>> shapes = {
        {1}, {7}, {1, 1}, {3, 1}, {1, 5}, {64, 64}, {65, 64}, {3, 100, 64}, {2, 3, 17, 5},
        {0, 64}, {64, 0}, {2, 0, 3}, {130, 3}, {2, 2, 2, 2, 2, 2, 2, 2}};
    const uint32_t block_sizes[] = {0, 1, 3, 64};
    for (ElementType t : {ElementType::F16, ElementType::BF16, ElementType::F32}) {
        for (const auto& dims : shapes) {
            Shape shape;
            shape.ndim = uint32_t(dims.size());
            for (size_t i = 0; i < dims.size(); ++i) shape.dims[i] = dims[i];
            const Bytes data = special_values(t, size_t(shape.elements()), g);
            for (uint32_t bt : block_sizes) {
                for (int variant = 0; variant < 4; ++variant) {
                    EncodeOptions o;
                    o.block_tokens = bt;
                    o.allow_zstd = variant != 1;
                    o.allow_rle = variant != 2;
                    o.predictors = variant == 3 ? predictor_bit(Predictor::Xor) : kAllPredictors;
                    Codec c(o);
                    Bytes frame;
                    const bool ok = round_trip(c, t, shape, data, &frame);
                    if (!ok) std::fprintf(stderr, "round trip failed: type %d ndim %u bt %u variant %d\n", int(t), shape.ndim, bt, variant);
                    CHECK(ok, "in %s", __func__);
                }
            }
        }
    }
}

// Structured data: each predictor and backend, and dedup, must be chosen somewhere.
void test_modes_are_used() {
    std::mt19937 g(7);
    EncodeOptions blocks;
    blocks.block_tokens = 64;
    Codec c(blocks);
    bool seen_pred[4] = {}, seen_backend[4] = {}, seen_dedup = false;
    auto note = [&](const Bytes& frame) {
        FrameInfo fi;
        std::vector<StreamInfo> st;
        CHECK(c.inspect(frame.data(), frame.size(), &fi, &st) == Status::Ok, "in %s", __func__);
        for (const auto& s : st) {
            if (s.block < 0) seen_dedup = true;
            seen_pred[int(s.predictor)] = true;
            seen_backend[int(s.backend)] = true;
        }
    };
    Bytes frame;
    const Bytes kv = kv_like(256, 64, g, false);
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(256, 64), kv, &frame), "in %s", __func__);
    note(frame);
    const Bytes rep = kv_like(256, 64, g, true);
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(256, 64), rep, &frame), "in %s", __func__);
    note(frame);
    // A slow ramp per channel (delta), and alternating bit patterns (xor).
    Bytes ramp(128 * 16 * 2), alt(128 * 16 * 2);
    for (size_t t = 0; t < 128; ++t)
        for (size_t c2 = 0; c2 < 16; ++c2) {
            const uint16_t r = uint16_t(t * 97 + c2 * 1000), a = uint16_t((t & 1) ? 0x5A5A : 0xA5A5) ^ uint16_t(c2 * 0x0101 * 7);
            std::memcpy(&ramp[(t * 16 + c2) * 2], &r, 2);
            std::memcpy(&alt[(t * 16 + c2) * 2], &a, 2);
        }
    EncodeOptions o;
    o.allow_zstd = false;  // RLE sees the runs the predictors make
    Codec rle(o);
    CHECK(round_trip(rle, ElementType::F16, Shape::matrix(128, 16), ramp, &frame), "in %s", __func__);
    note(frame);
    CHECK(round_trip(rle, ElementType::F16, Shape::matrix(128, 16), alt, &frame), "in %s", __func__);
    note(frame);
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(128, 16), special_values(ElementType::F16, 128 * 16, g), &frame), "in %s", __func__);
    note(frame);
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(256, 16), repeating_top_rows(g), &frame), "in %s", __func__);
    note(frame);
    CHECK(seen_pred[0] && seen_pred[1] && seen_pred[2] && seen_pred[3], "in %s", __func__);
    CHECK(seen_backend[0] && seen_backend[1] && seen_backend[3], "in %s", __func__);
    CHECK(seen_backend[2] == zstd_available(), "in %s", __func__);
    CHECK(seen_dedup, "in %s", __func__);
}

// Damaged rANS payloads inside frames: an error, or the original data (bits the format ignores).
// Flipping bits of frame[first..] is an error or decodes to data (bits the format ignores);
// every truncation is an error.
void check_damage(Codec& c, const Bytes& frame, const Bytes& data, size_t first, std::initializer_list<uint8_t> flips) {
    Bytes out;
    for (size_t i = first; i < frame.size(); ++i) {
        for (uint8_t flip : flips) {
            Bytes bad = frame;
            bad[i] ^= flip;
            const Status s = decode(c, bad, &out);
            CHECK(s != Status::Ok || out == data, "byte %zu flip %02x", i, flip);
        }
    }
    for (size_t n = 0; n < frame.size(); ++n) {
        Bytes cut(frame.begin(), frame.begin() + n);
        CHECK(decode(c, cut, &out) != Status::Ok, "truncated to %zu bytes", n);
    }
}

void test_rans_damage() {
    std::mt19937 g(31);
    EncodeOptions o;
    o.allow_zstd = false;
    o.allow_rle = false;
    Codec c(o);
    Bytes data(300 * 8 * 2), frame;
    for (size_t i = 0; i < data.size(); i += 2) {
        data[i] = uint8_t(g());
        data[i + 1] = uint8_t(i / 2 % 8 < 4 ? 0x3C : 0x30 + g() % 24);
    }
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(300, 8), data, &frame), "in %s", __func__);
    FrameInfo fi;
    std::vector<StreamInfo> st;
    CHECK(c.inspect(frame.data(), frame.size(), &fi, &st) == Status::Ok && st[1].backend == Backend::Rans, "in %s", __func__);
    check_damage(c, frame, data, 32, {0x01, 0x10, 0x80});
}

// Any damage is an error, or decodes to the original data (bits the format ignores).
void test_damage_and_truncation() {
    std::mt19937 g(99);
    Codec c;
    const Bytes data = kv_like(40, 8, g, true);
    Bytes frame, out;
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(40, 8), data, &frame), "in %s", __func__);
    check_damage(c, frame, data, 0, {0x01, 0x80, 0xFF});
    Bytes longer = frame;
    longer.push_back(0);
    CHECK(decode(c, longer, &out) == Status::Corrupt, "in %s", __func__);
    out.assign(data.size() - 1, 0);
    CHECK(c.decode(frame.data(), frame.size(), out.data(), out.size()) == Status::OutputTooSmall, "in %s", __func__);
    size_t written = 0;
    CHECK(c.encode(data.data(), ElementType::F16, Shape::matrix(40, 8), out.data(), 10, &written) ==
          Status::OutputTooSmall, "in %s", __func__);
    Bytes bad = frame;
    bad[0] = 'X';
    CHECK(decode(c, bad, &out) == Status::BadMagic, "in %s", __func__);
    bad = frame;
    bad[4] = 2;
    CHECK(decode(c, bad, &out) == Status::BadVersion, "in %s", __func__);
    bad = frame;
    bad[5] = 2;  // BF16 instead of FP16: same bytes, other meaning; the header check catches it
    CHECK(decode(c, bad, &out) == Status::BadHeader, "in %s", __func__);
    bad = frame;
    bad[bad.size() - 1] ^= 1;  // last payload byte
    CHECK(decode(c, bad, &out) != Status::Ok, "in %s", __func__);
}

// --- quantised rows (docs/gear_format.md "Quantised rows") ---------------------------------------

// The Q8 example of docs/gear_format.md, byte for byte.
void test_quantised_document_example() {
    Bytes row;
    for (int i = 0; i < 32; ++i) row.push_back(uint8_t(i - 16));
    row.push_back(0x00);
    row.push_back(0x2C);
    Bytes f = header(4, {1, 32}, 1, row);
    f.push_back(0);
    stream(f, 0, 0, 32, Bytes(row.begin(), row.begin() + 32));
    stream(f, 0, 0, 1, {0x00});
    stream(f, 0, 0, 1, {0x2C});
    Codec c;
    Bytes out;
    CHECK(decode(c, f, &out) == Status::Ok && out == row, "in %s", __func__);
    FrameInfo fi;
    CHECK(read_frame_info(f.data(), f.size(), &fi) == Status::Ok && fi.element_type == ElementType::Q8 &&
              fi.decoded_size == 34, "in %s", __func__);
}

// Q4 [2][64]: the planes' widths (32 code bytes, 2 scales), xor on the codes, centre on the
// scales' high bytes (FP16's exponent mask); and channels that are not whole groups.
void test_quantised_hand_built() {
    Bytes data;
    const uint16_t scales[2][2] = {{0x3C00, 0x2C10}, {0x3C00, 0x2C20}};
    for (int t = 0; t < 2; ++t) {
        for (int c = 0; c < 32; ++c) data.push_back(uint8_t(c + 16 * t));
        for (uint16_t v : scales[t]) {
            data.push_back(uint8_t(v));
            data.push_back(uint8_t(v >> 8));
        }
    }
    Bytes f = header(5, {2, 64}, 2, data);
    f.push_back(0);
    Bytes codes(data.begin(), data.begin() + 32);
    for (int c = 0; c < 32; ++c) codes.push_back(uint8_t((c + 16) ^ c));
    stream(f, 1, 0, 64, codes);                         // plane 0: xor, stored
    stream(f, 0, 0, 4, {0x00, 0x10, 0x00, 0x20});       // plane 1: scale low bytes
    stream(f, 3, 0, 6, {0x3C, 0x2C, 0, 0, 0, 0});       // plane 2: refs 3C 2C, residuals 0
    Codec c;
    Bytes out;
    CHECK(decode(c, f, &out) == Status::Ok && out == data, "in %s", __func__);
    // Centre on the codes plane (not the top plane) is an error.
    Bytes bad = header(5, {2, 64}, 2, data);
    bad.push_back(0);
    Bytes centre_codes(32, 0);
    centre_codes.insert(centre_codes.end(), codes.begin(), codes.end());
    stream(bad, 3, 0, 96, centre_codes);
    stream(bad, 0, 0, 4, {0x00, 0x10, 0x00, 0x20});
    stream(bad, 3, 0, 6, {0x3C, 0x2C, 0, 0, 0, 0});
    CHECK(decode(c, bad, &out) == Status::Corrupt, "in %s", __func__);
    // 48 values are not whole groups of 32: the header is refused, and the encoder refuses them.
    bad = header(4, {1, 48}, 1, Bytes(51, 0));
    CHECK(decode(c, bad, &out) == Status::BadHeader, "in %s", __func__);
    CHECK(c.encode(data.data(), ElementType::Q8, Shape::matrix(1, 48), &out) == Status::InvalidArgument, "in %s", __func__);
    CHECK(c.encode(data.data(), ElementType::Q4, Shape{1, {32}}, &out) == Status::InvalidArgument, "in %s", __func__);
    CHECK(max_encoded_size(ElementType::Q8, Shape::matrix(1, 48), 0) == 0, "in %s", __func__);
    uint64_t rb = 0;
    CHECK(row_bytes(ElementType::Q8, 64, &rb) && rb == 68 && row_bytes(ElementType::Q4, 64, &rb) && rb == 36,
          "in %s", __func__);
}

// Rows of `type` (Q8 or Q4) of KV-like values, quantised as the cache does; every third row after
// the fourth repeats an earlier one when repeat_rows.
Bytes quantised_kv_rows(KvDtype type, size_t rows, size_t channels, std::mt19937& g, bool repeat_rows) {
    std::normal_distribution<float> nd;
    std::vector<float> scale(channels), x(rows * channels);
    for (auto& s : scale) s = std::pow(10.f, std::uniform_real_distribution<float>(-2, 2)(g));
    for (size_t t = 0; t < rows; ++t) {
        const size_t src = repeat_rows && t >= 4 && g() % 3 == 0 ? g() % t : t;
        for (size_t c = 0; c < channels; ++c)
            x[t * channels + c] = src == t ? nd(g) * scale[c] : x[src * channels + c];
    }
    Bytes b(rows * kv_row_bytes(type, int(channels)));
    kv_rows_from_f32(type, x.data(), b.data(), rows, int(channels));
    return b;
}

// Any bytes round-trip in every shape, block size and option set; KV-like rows shrink.
void test_quantised_round_trips() {
    std::mt19937 g(4321);
    const std::vector<std::vector<uint32_t>> shapes = {
        {1, 32}, {64, 64}, {65, 96}, {3, 100, 64}, {2, 3, 17, 32}, {0, 64}, {64, 0}, {2, 0, 32}, {130, 32}};
    for (ElementType t : {ElementType::Q8, ElementType::Q4}) {
        for (const auto& dims : shapes) {
            Shape shape;
            shape.ndim = uint32_t(dims.size());
            for (size_t i = 0; i < dims.size(); ++i) shape.dims[i] = dims[i];
            uint64_t row = 0;
            CHECK(row_bytes(t, dims.back(), &row), "in %s", __func__);
            Bytes data(dims.back() ? size_t(shape.elements() / dims.back() * row) : 0);
            for (auto& b : data) b = uint8_t(g());
            for (size_t i = 0; row && i + row <= data.size(); i += 3 * row)  // repeated rows: dedup
                std::memcpy(&data[i], data.data(), row);
            for (uint32_t bt : {0u, 1u, 3u, 64u}) {
                for (int variant = 0; variant < 4; ++variant) {
                    EncodeOptions o;
                    o.block_tokens = bt;
                    o.allow_zstd = variant != 1;
                    o.allow_rle = variant != 2;
                    o.dedup = variant != 3;
                    Codec c(o);
                    Bytes frame;
                    const bool ok = round_trip(c, t, shape, data, &frame);
                    if (!ok) std::fprintf(stderr, "round trip failed: type %d ndim %u bt %u variant %d\n", int(t), shape.ndim, bt, variant);
                    CHECK(ok, "in %s", __func__);
                }
            }
        }
    }
    // K/V-like rows, two heads of 256 tokens, as a store chunk frame [2][tokens][64].
    for (KvDtype type : {KvDtype::Q8, KvDtype::Q4}) {
        const ElementType t = type == KvDtype::Q8 ? ElementType::Q8 : ElementType::Q4;
        const Bytes data = quantised_kv_rows(type, 512, 64, g, true);
        Codec c;
        Bytes frame;
        CHECK(round_trip(c, t, Shape{3, {2, 256, 64}}, data, &frame), "in %s", __func__);
        CHECK(frame.size() < data.size(), "in %s: %zu >= %zu", __func__, frame.size(), data.size());
        FrameInfo fi;
        std::vector<StreamInfo> st;
        CHECK(c.inspect(frame.data(), frame.size(), &fi, &st) == Status::Ok, "in %s", __func__);
        size_t planes = 0;
        for (const auto& s : st) planes += s.block >= 0;
        CHECK(planes == 2 * 3, "in %s", __func__);  // two slices of one block of 3 planes
    }
}

// Damaged Q8 and Q4 frames (dedup, several blocks): an error or the original data.
void test_quantised_damage() {
    std::mt19937 g(77);
    EncodeOptions o;
    o.block_tokens = 16;
    Codec c(o);
    for (KvDtype type : {KvDtype::Q8, KvDtype::Q4}) {
        const ElementType t = type == KvDtype::Q8 ? ElementType::Q8 : ElementType::Q4;
        const Bytes data = quantised_kv_rows(type, 40, 32, g, true);
        Bytes frame;
        CHECK(round_trip(c, t, Shape::matrix(40, 32), data, &frame), "in %s", __func__);
        check_damage(c, frame, data, 0, {0x01, 0x80});
    }
}

void test_invalid_arguments() {
    Codec c;
    Bytes frame;
    const uint16_t x = 0;
    Shape none;
    CHECK(c.encode(&x, ElementType::F16, none, &frame) == Status::InvalidArgument, "in %s", __func__);
    CHECK(c.encode(&x, static_cast<ElementType>(9), Shape::matrix(1, 1), &frame) == Status::InvalidArgument, "in %s", __func__);
    Shape huge = Shape::matrix(0xFFFFFFFF, 0xFFFFFFFF);
    CHECK(c.encode(&x, ElementType::F16, huge, &frame) == Status::InvalidArgument, "in %s", __func__);
    CHECK(max_encoded_size(ElementType::F16, none, 64) == 0, "in %s", __func__);
}

// After one call of a given size, encode and decode allocate nothing: 64-token blocks, and 256
// tokens whose channels are of two kinds (rANS with several tables).
void test_no_allocation_when_warm() {
    std::mt19937 g(5);
    for (uint32_t tokens : {64u, 256u}) {
        Codec c;
        const Shape shape = Shape::matrix(tokens, 64);
        Bytes a = kv_like(tokens, 64, g, true), b = kv_like(tokens, 64, g, false);
        if (tokens == 256)
            for (size_t i = 1; i < b.size(); i += 4) b[i] = uint8_t(0x3C + g() % 2);  // even channels
        Bytes frame(max_encoded_size(ElementType::F16, shape, 0)), out(a.size());
        size_t n = 0;
        for (const Bytes* d : {&a, &b}) {
            CHECK(c.encode(d->data(), ElementType::F16, shape, frame.data(), frame.size(), &n) == Status::Ok, "in %s", __func__);
            CHECK(c.decode(frame.data(), n, out.data(), out.size()) == Status::Ok, "in %s", __func__);
        }
        if (tokens == 256) {  // b's top plane has several rANS tables: G - 1 in the payload's mode byte
            FrameInfo fi;
            std::vector<StreamInfo> st;
            CHECK(c.inspect(frame.data(), n, &fi, &st) == Status::Ok && st[1].backend == Backend::Rans, "in %s", __func__);
            CHECK(frame[fi.header_size + 1 + 10 + st[0].payload_len + 10] >> 4 != 0, "in %s", __func__);
        }
        const size_t before = g_allocations;
        for (const Bytes* d : {&a, &b}) {
            CHECK(c.encode(d->data(), ElementType::F16, shape, frame.data(), frame.size(), &n) == Status::Ok, "in %s", __func__);
            CHECK(c.decode(frame.data(), n, out.data(), out.size()) == Status::Ok, "in %s", __func__);
            CHECK(out == *d, "in %s", __func__);
        }
        CHECK(g_allocations == before, "in %s: %u tokens", __func__, tokens);
    }
}

void test_deterministic() {
    std::mt19937 g(3);
    const Bytes a = kv_like(100, 32, g, true);
    Codec c1, c2;
    Bytes f1, f2, f3;
    CHECK(c1.encode(a.data(), ElementType::F16, Shape::matrix(100, 32), &f1) == Status::Ok, "in %s", __func__);
    CHECK(c1.encode(a.data(), ElementType::F16, Shape::matrix(100, 32), &f2) == Status::Ok, "in %s", __func__);
    CHECK(c2.encode(a.data(), ElementType::F16, Shape::matrix(100, 32), &f3) == Status::Ok, "in %s", __func__);
    CHECK(f1 == f2 && f1 == f3, "in %s", __func__);
}

// Run in a child with MNN_H2O_NO_ZSTD=1: RLE and rANS still work, zstd frames are refused cleanly.
int child_without_zstd(const char* zstd_frame_path) {
    CHECK(!zstd_available(), "in %s", __func__);
    std::mt19937 g(11);
    Codec c;
    Bytes frame;
    const Bytes kv = kv_like(64, 64, g, true);
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(64, 64), kv, &frame), "in %s", __func__);
    FrameInfo fi;
    std::vector<StreamInfo> st;
    CHECK(c.inspect(frame.data(), frame.size(), &fi, &st) == Status::Ok && st.back().backend == Backend::Rans,
          "in %s", __func__);
    FILE* f = std::fopen(zstd_frame_path, "rb");
    CHECK(f != nullptr, "in %s", __func__);
    if (f) {
        Bytes z(1 << 16);
        z.resize(std::fread(z.data(), 1, z.size(), f));
        std::fclose(f);
        Bytes out;
        CHECK(decode(c, z, &out) == Status::ZstdUnavailable, "in %s", __func__);
    }
    return g_failures ? 1 : 0;
}

void test_without_zstd(const char* self) {
    if (!zstd_available()) {
        std::printf("libzstd.so.1 not available: zstd paths untested\n");
        return;
    }
    std::mt19937 g(11);
    Codec c;
    Bytes frame;
    CHECK(round_trip(c, ElementType::F16, Shape::matrix(256, 16), repeating_top_rows(g), &frame), "in %s", __func__);
    FrameInfo fi;
    std::vector<StreamInfo> st;
    CHECK(c.inspect(frame.data(), frame.size(), &fi, &st) == Status::Ok && st.back().backend == Backend::Zstd,
          "in %s", __func__);
    const std::string path = "gear_zstd_frame.bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    CHECK(f && std::fwrite(frame.data(), 1, frame.size(), f) == frame.size(), "in %s", __func__);
    if (f) std::fclose(f);
    const std::string cmd = std::string("MNN_H2O_NO_ZSTD=1 '") + self + "' --child-no-zstd " + path;
    CHECK(std::system(cmd.c_str()) == 0, "in %s", __func__);
    std::remove(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && !std::strcmp(argv[1], "--child-no-zstd")) return child_without_zstd(argv[2]);
    test_xxh64();
    test_document_example();
    test_hand_built_predictors();
    test_shared_map();
    test_empty_planes();
    test_rans_document_example();
    test_rans_malformed_payloads();
    test_rans_round_trips();
    test_round_trips();
    test_modes_are_used();
    test_rans_damage();
    test_damage_and_truncation();
    test_quantised_document_example();
    test_quantised_hand_built();
    test_quantised_round_trips();
    test_quantised_damage();
    test_invalid_arguments();
    test_no_allocation_when_warm();
    test_deterministic();
    test_without_zstd(argv[0]);
    std::printf("zstd %s; %d failure(s)\n", zstd_available() ? "loaded" : "missing", g_failures);
    return g_failures ? 1 : 0;
}
