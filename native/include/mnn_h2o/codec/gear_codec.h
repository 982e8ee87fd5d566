// Gear: a lossless codec for KV-cache tensors (FP16, BF16, FP32, and the cache's quantised q8 / q4
// rows), frame format in docs/gear_format.md.
//
// Values are split into byte planes (a quantised row: its codes, its scales' low and high bytes);
// per plane the codec picks a predictor along tokens (raw, xor, delta, or a per-channel exponent
// model on the sign/exponent plane) and a backend (stored, RLE, rANS, or zstd when libzstd.so.1
// can be loaded) and keeps the smallest. Every frame carries
// an XXH64 of the data, checked by every decode: a damaged frame is an error, never wrong data.
//
// The unit of work is a [tokens][channels] array. The cache compresses one block of
// block_tokens tokens at a time (64 x 64 FP16 = 8 KiB), so a Codec keeps its scratch buffers
// and zstd contexts between calls: after the first call of a given size, encode and decode do
// not allocate. A Codec is not thread-safe; use one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace mnn_h2o {
namespace gear {

// Q8 and Q4: rows of int8 / 4-bit codes, then a binary16 scale per kQuantGroup values, as the KV
// cache lays them out (docs/kv_cache.md "Row formats"); their channels are a multiple of
// kQuantGroup.
enum class ElementType : uint8_t { F16 = 1, BF16 = 2, F32 = 3, Q8 = 4, Q4 = 5 };
enum class Predictor : uint8_t { Raw = 0, Xor = 1, Delta = 2, Centre = 3 };
enum class Backend : uint8_t { Stored = 0, Rle = 1, Zstd = 2, Rans = 3 };

enum class Status {
    Ok = 0,
    InvalidArgument,   // encode: bad shape or options
    OutputTooSmall,    // the output buffer cannot hold the result
    Truncated,         // the frame ends inside a field or a payload
    BadMagic,          // not a Gear frame
    BadVersion,        // a Gear version this decoder does not know
    BadHeader,         // header fields out of range, or header_check mismatch
    Corrupt,           // a stream or map that breaks the format
    ChecksumMismatch,  // decoded fine, but the data is not what was encoded
    ZstdUnavailable,   // the frame uses zstd and libzstd.so.1 could not be loaded
};
const char* status_name(Status s);

constexpr uint32_t kMaxDims = 8;
constexpr uint32_t kQuantGroup = 32;  // values per scale of Q8 and Q4

struct Shape {
    uint32_t ndim = 0;
    uint32_t dims[kMaxDims] = {};

    static Shape matrix(uint32_t tokens, uint32_t channels) { return Shape{2, {tokens, channels}}; }
    uint64_t elements() const;  // product of dims (an empty shape has none)
};

constexpr uint32_t predictor_bit(Predictor p) { return 1u << static_cast<unsigned>(p); }
constexpr uint32_t kAllPredictors = 0xF;

struct EncodeOptions {
    // Predictors the encoder may choose from (predictor_bit masks). Raw is always allowed.
    uint32_t predictors = kAllPredictors;
    bool allow_rle = true;
    bool allow_zstd = true;
    // Static order-0 rANS (no library needed), with per-channel-group tables on long slices.
    bool allow_rans = true;
    int zstd_level = 1;
    // Tokens per block inside a frame; 0 puts each slice's tokens in a single block, which
    // compresses best (a cache that compresses block by block encodes each block as its own
    // frame). Smaller blocks bound the scratch memory for very long arrays.
    uint32_t block_tokens = 0;
    // Code repeated token rows once (pays in layer 0, where values depend on the token only).
    bool dedup = true;
};

struct FrameInfo {
    ElementType element_type = ElementType::F16;
    Shape shape;
    uint32_t block_tokens = 0;
    uint64_t data_checksum = 0;
    size_t header_size = 0;
    size_t decoded_size = 0;  // bytes of the decoded array
};

// One stream of a frame, as inspect() reports it.
struct StreamInfo {
    uint32_t slice = 0;
    int32_t block = -1;  // -1 for a dedup map stream
    uint32_t plane = 0;
    Predictor predictor = Predictor::Raw;
    Backend backend = Backend::Stored;
    uint32_t raw_len = 0;
    uint32_t payload_len = 0;
};

// Bytes of one row of `channels` values of type t (codes and scales for Q8 and Q4); false when
// t is not a type or channels is not a whole number of its groups.
bool row_bytes(ElementType t, uint64_t channels, uint64_t* bytes);

// Bytes enough for any frame encode() can produce for this array (no compression at all, plus
// every header). 0 when the shape is invalid.
size_t max_encoded_size(ElementType type, const Shape& shape, uint32_t block_tokens);

// Parses and checks the frame header only (for sizing the output buffer before decode).
[[nodiscard]] Status read_frame_info(const uint8_t* frame, size_t size, FrameInfo* info);

// True when libzstd.so.1 was loaded (zstd streams can be written and read).
bool zstd_available();

namespace detail {
struct Scratch;  // buffers and zstd contexts reused across calls
}

class Codec {
public:
    explicit Codec(const EncodeOptions& options = EncodeOptions());
    ~Codec();
    Codec(const Codec&) = delete;
    Codec& operator=(const Codec&) = delete;

    const EncodeOptions& options() const { return options_; }
    void set_options(const EncodeOptions& options) { options_ = options; }

    // Encodes `data` (row-major rows of `type`, in host = little-endian byte order) into
    // out[0, capacity); *written gets the frame size. capacity >= max_encoded_size() always
    // suffices.
    [[nodiscard]] Status encode(const void* data, ElementType type, const Shape& shape,
                                uint8_t* out, size_t capacity, size_t* written);
    // Convenience: resizes *out to the frame.
    [[nodiscard]] Status encode(const void* data, ElementType type, const Shape& shape,
                                std::vector<uint8_t>* out);

    // Decodes a whole frame into out[0, capacity). On success the output is bit-exact and
    // verified against the frame's checksum; on any error its contents are unspecified. `info`
    // (optional) receives the header.
    [[nodiscard]] Status decode(const uint8_t* frame, size_t size, void* out, size_t capacity,
                                FrameInfo* info = nullptr);

    // Walks every stream of a frame without decoding the planes (dedup maps are decoded, since
    // they give the number of blocks) and checks the structure; the checksum is not verified.
    [[nodiscard]] Status inspect(const uint8_t* frame, size_t size, FrameInfo* info,
                                 std::vector<StreamInfo>* streams);

private:
    EncodeOptions options_;
    std::unique_ptr<detail::Scratch> s_;
};

}  // namespace gear
}  // namespace mnn_h2o
