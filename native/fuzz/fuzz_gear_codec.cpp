// libFuzzer target for the Gear codec (build: see the MNN_H2O_FUZZ block in CMakeLists.txt).
//
// The first input byte, modulo 3, picks what the rest is:
//   0: a frame to decode. Random bytes would almost never pass the header check, so the
//      header's check field is recomputed first; everything behind it (streams, maps, RLE, zstd
//      and rANS payloads, checksums) is the fuzzer's. A decode must fail cleanly or, if it
//      succeeds, re-encode and decode to the same data.
//   1: an array to round-trip (type (float or quantised rows), channels, block size and options
//      from the next bytes),
//      then the encoded frame damaged at fuzzer-chosen places: decoding a damaged frame must
//      give an error or exactly the original data.
//   2: an rANS payload (columns and symbol count from the next 3 bytes) for the backend's
//      decoder directly, which reaches its table parsing without a frame around it; what decodes
//      must round-trip through the rANS encoder.
// Any other outcome aborts; ASan/UBSan report memory and undefined-behaviour errors.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../src/codec/gear_rans.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/codec/xxhash64.h"

using namespace mnn_h2o;
using namespace mnn_h2o::gear;

namespace {

constexpr size_t kMaxDecoded = 1 << 22;

void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_gear_codec: %s\n", what);
        std::abort();
    }
}

bool same(const uint8_t* a, const uint8_t* b, size_t n) { return n == 0 || !std::memcmp(a, b, n); }

void fuzz_decode(Codec& c, const uint8_t* data, size_t size) {
    std::vector<uint8_t> frame(data, data + size);
    if (size >= 8 && frame[6] >= 1 && frame[6] <= kMaxDims) {
        const size_t hs = 24 + 4 * size_t{frame[6]};
        if (size >= hs) {
            const uint32_t check = static_cast<uint32_t>(xxh64(frame.data(), hs - 4));
            std::memcpy(&frame[hs - 4], &check, 4);
        }
    }
    FrameInfo fi;
    std::vector<StreamInfo> streams;
    (void)c.inspect(frame.data(), frame.size(), &fi, &streams);
    if (read_frame_info(frame.data(), frame.size(), &fi) != Status::Ok || fi.decoded_size > kMaxDecoded)
        return;
    std::vector<uint8_t> out(fi.decoded_size);
    if (c.decode(frame.data(), frame.size(), out.data(), out.size()) != Status::Ok) return;
    std::vector<uint8_t> again, out2(out.size());
    require(c.encode(out.data(), fi.element_type, fi.shape, &again) == Status::Ok, "re-encode failed");
    require(c.decode(again.data(), again.size(), out2.data(), out2.size()) == Status::Ok, "re-decode failed");
    require(out == out2, "re-encoded data differs");
}

void fuzz_round_trip(const uint8_t* data, size_t size) {
    if (size < 6) return;
    const auto type = static_cast<ElementType>(data[0] % 5 + 1);
    const bool quantised = type == ElementType::Q8 || type == ElementType::Q4;
    // Quantised rows hold whole groups of kQuantGroup values.
    const uint32_t channels = quantised ? (data[1] % 3 + 1) * kQuantGroup : data[1] % 20 + 1;
    EncodeOptions o;
    o.block_tokens = data[2] % 10;  // 0 = whole slice
    o.predictors = data[3] & 0xF;
    o.allow_rle = data[3] & 0x10;
    o.allow_zstd = data[3] & 0x20;
    o.dedup = data[3] & 0x40;
    o.zstd_level = data[3] & 0x80 ? 3 : 1;
    const size_t damage = data[4] % 4;  // bytes to damage, at positions taken from the tail
    o.allow_rans = !(data[4] & 4);
    data += 5;
    size -= 5;
    uint64_t row = 0;
    require(row_bytes(type, channels, &row), "no row size");
    const size_t row_size = static_cast<size_t>(row);
    const size_t tail = damage * 3;
    if (size < tail) return;
    const uint32_t tokens = static_cast<uint32_t>((size - tail) / row_size);
    const uint8_t* how = data + size - tail;
    // Two slices when there are enough tokens, to cover the slice loop.
    const bool two = tokens >= 2 && tokens % 2 == 0;
    const Shape shape = two ? Shape{3, {2, tokens / 2, channels}} : Shape::matrix(tokens, channels);
    Codec c(o);
    std::vector<uint8_t> frame, out(size_t{tokens} * row_size);
    require(c.encode(data, type, shape, &frame) == Status::Ok, "encode failed");
    require(frame.size() <= max_encoded_size(type, shape, o.block_tokens), "frame exceeds max_encoded_size");
    require(c.decode(frame.data(), frame.size(), out.data(), out.size()) == Status::Ok, "decode failed");
    require(same(out.data(), data, out.size()), "round trip differs");
    if (!damage || frame.empty()) return;
    for (size_t i = 0; i < damage; ++i) {
        const size_t pos = (size_t{how[3 * i]} << 8 | how[3 * i + 1]) % frame.size();
        frame[pos] ^= how[3 * i + 2] ? how[3 * i + 2] : 1;
    }
    if (c.decode(frame.data(), frame.size(), out.data(), out.size()) == Status::Ok)
        require(same(out.data(), data, out.size()), "damaged frame decoded to other data");
}

void fuzz_rans(const uint8_t* data, size_t size) {
    if (size < 3) return;
    const size_t columns = data[0] % 70 + 1, n = data[1] | size_t{data[2]} << 8;
    std::vector<uint8_t> out(n), payload, again(n);
    rans::Decoder d;
    if (!d.decode(data + 3, size - 3, out.data(), n, columns) || n == 0) return;
    rans::Encoder e;
    const size_t estimate = e.plan(out.data(), n, columns);
    require(estimate != SIZE_MAX, "no rANS plan for decoded data");
    payload.resize(2 * n + 4096);
    const size_t len = e.encode(out.data(), n, columns, payload.data(), payload.size());
    require(len > 0, "rANS encode failed");
    require(d.decode(payload.data(), len, again.data(), n, columns), "rANS re-decode failed");
    require(again == out, "rANS re-encoded data differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    // A fresh codec per input: a crash must not depend on the scratch buffers of earlier inputs
    // (an empty plane's buffer is null only in a new codec), so that every artifact reproduces.
    Codec codec;
    if (data[0] % 3 == 0)
        fuzz_decode(codec, data + 1, size - 1);
    else if (data[0] % 3 == 1)
        fuzz_round_trip(data + 1, size - 1);
    else
        fuzz_rans(data + 1, size - 1);
    return 0;
}
