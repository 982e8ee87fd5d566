// One file: encoder and decoder mirror each other (docs/gear_format.md) and share private helpers.
// The Gear codec. The byte layout implemented here is specified in docs/gear_format.md; the
// section names of that document appear in the comments below.
#include "mnn_h2o/codec/gear_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gear_kernels.h"
#include "gear_rans.h"
#include "mnn_h2o/codec/xxhash64.h"
#include "mnn_h2o/codec/zstd_loader.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "The Gear codec reads and writes little-endian data as host-order bytes."
#endif

namespace mnn_h2o {
namespace gear {

const char* status_name(Status s) {
    switch (s) {
        case Status::Ok: return "ok";
        case Status::InvalidArgument: return "invalid argument";
        case Status::OutputTooSmall: return "output buffer too small";
        case Status::Truncated: return "truncated frame";
        case Status::BadMagic: return "not a Gear frame (bad magic)";
        case Status::BadVersion: return "unsupported Gear version";
        case Status::BadHeader: return "corrupt frame header";
        case Status::Corrupt: return "corrupt stream";
        case Status::ChecksumMismatch: return "checksum mismatch";
        case Status::ZstdUnavailable: return "frame needs zstd but libzstd.so.1 is not available";
    }
    return "?";
}

uint64_t Shape::elements() const {
    if (ndim == 0) return 0;
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; ++i) {
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(dims[i]), &n)) return UINT64_MAX;
    }
    return n;
}

bool zstd_available() { return zstd::api() != nullptr; }

namespace {

constexpr uint8_t kMagic[4] = {0x47, 0x45, 0x41, 0x52};  // "GEAR"
constexpr uint8_t kVersion = 1;
constexpr size_t kStreamHeaderSize = 10;
constexpr uint8_t kSliceDedup = 1;
constexpr uint8_t kSliceSameMap = 2;  // with kSliceDedup: the previous slice's map, not repeated
// Order-0 estimate above which a stream is stored without trying the backends: only long-range
// repeats could still be found there, and dedup already removes those.
constexpr double kIncompressibleBitsPerByte = 7.9;
// The most raw bytes per payload byte a ZSTD or rANS stream may claim (docs/gear_format.md,
// "Limits"; RLE's limit is 65).
constexpr uint64_t kMaxExpansion = 32768;

size_t header_size(uint32_t ndim) { return 24 + 4 * static_cast<size_t>(ndim); }

bool quantised(ElementType t) { return t == ElementType::Q8 || t == ElementType::Q4; }

// The top plane's exponent field: FP16's for FP16 and for the binary16 scales of quantised rows.
uint8_t exponent_field_mask(ElementType t) { return t == ElementType::BF16 || t == ElementType::F32 ? 0x7F : 0x7C; }

bool valid_element_type(uint8_t t) { return t >= 1 && t <= 5; }

constexpr size_t kMaxPlanes = 4;

// The "Geometry" paragraph of the format: slices of tokens x channels elements, and the planes a
// row is cut into ("Planes").
struct Geometry {
    ElementType type = ElementType::F16;
    size_t planes = 2;                // streams per block: elem_size for float types, 3 quantised
    uint64_t width[kMaxPlanes] = {};  // bytes of one row in each plane
    uint64_t slices = 0, tokens = 0, channels = 0;
    uint64_t row_bytes = 0;
    uint64_t slice_bytes = 0;
    uint64_t total_bytes = 0;
    uint32_t block_tokens = 1;
    uint32_t map_width = 1;
};

uint32_t tokens_of(const Shape& shape) {
    return shape.ndim == 1 ? shape.dims[0] : shape.dims[shape.ndim - 2];
}

// The block_tokens written to the header: the request (0 = all tokens), at most the tokens.
uint32_t effective_block_tokens(const Shape& shape, uint32_t requested) {
    if (shape.ndim < 1 || shape.ndim > kMaxDims) return 0;
    const uint32_t tokens = std::max<uint32_t>(tokens_of(shape), 1);
    return requested ? std::min(requested, tokens) : tokens;
}

bool make_geometry(ElementType type, const Shape& shape, uint32_t block_tokens, Geometry* g) {
    if (shape.ndim < 1 || shape.ndim > kMaxDims || block_tokens < 1) return false;
    g->type = type;
    const uint32_t n = shape.ndim;
    g->channels = n == 1 ? 1 : shape.dims[n - 1];
    g->tokens = tokens_of(shape);
    if (!row_bytes(type, g->channels, &g->row_bytes)) return false;
    if (quantised(type)) {
        g->planes = 3;
        g->width[1] = g->width[2] = g->channels / kQuantGroup;
        g->width[0] = g->row_bytes - 2 * g->width[1];
    } else {
        g->planes = type == ElementType::F32 ? 4 : 2;  // one per byte of an element
        for (size_t k = 0; k < g->planes; ++k) g->width[k] = g->channels;
    }
    const uint64_t elements = shape.elements();
    if (elements == UINT64_MAX || elements > (UINT64_MAX >> 3)) return false;
    // A prefix of the product elements() computed without overflow, so it cannot overflow.
    g->slices = 1;
    for (uint32_t i = 0; i + 2 < n; ++i) g->slices *= shape.dims[i];
    g->slice_bytes = g->tokens * g->row_bytes;
    // Rows times row_bytes, at most 4 bytes per element, so it fits.
    g->total_bytes = g->channels ? elements / g->channels * g->row_bytes : 0;
    if (g->total_bytes > SIZE_MAX) return false;
    g->block_tokens = block_tokens;
    // Every block plane (plus the centre references) must fit a u32 raw_len.
    const uint64_t block_rows = std::min<uint64_t>(block_tokens, std::max<uint64_t>(g->tokens, 1));
    if (block_rows * g->channels + g->channels > UINT32_MAX) return false;
    g->map_width = g->tokens <= 256 ? 1 : g->tokens <= 65536 ? 2 : 4;
    return true;
}

// --- byte cursors -----------------------------------------------------------------------------

class Writer {
public:
    Writer(uint8_t* p, size_t cap) : p_(p), cap_(cap) {}
    bool ok() const { return ok_; }
    size_t pos() const { return pos_; }
    uint8_t* at(size_t pos) { return p_ + pos; }
    // Room for n bytes at the current position, or nullptr (and the writer fails).
    uint8_t* reserve(size_t n) {
        if (!ok_ || cap_ - pos_ < n) {
            ok_ = false;
            return nullptr;
        }
        uint8_t* q = p_ + pos_;
        pos_ += n;
        return q;
    }
    void bytes(const void* src, size_t n) {
        uint8_t* q = reserve(n);
        if (q && n) std::memcpy(q, src, n);  // src may be null when n is 0
    }
    void u8(uint8_t v) { bytes(&v, 1); }
    void u32(uint32_t v) { bytes(&v, 4); }
    void u64(uint64_t v) { bytes(&v, 8); }

private:
    uint8_t* p_;
    size_t cap_;
    size_t pos_ = 0;
    bool ok_ = true;
};

class Reader {
public:
    Reader(const uint8_t* p, size_t size) : p_(p), size_(size) {}
    size_t pos() const { return pos_; }
    size_t left() const { return size_ - pos_; }
    bool take(size_t n, const uint8_t** out) {
        if (left() < n) return false;
        *out = p_ + pos_;
        pos_ += n;
        return true;
    }
    bool u8(uint8_t* v) { return read(v, 1); }
    bool u32(uint32_t* v) { return read(v, 4); }
    bool u64(uint64_t* v) { return read(v, 8); }

private:
    bool read(void* v, size_t n) {
        const uint8_t* q;
        if (!take(n, &q)) return false;
        std::memcpy(v, q, n);
        return true;
    }
    const uint8_t* p_;
    size_t size_;
    size_t pos_ = 0;
};

// --- RLE backend ------------------------------------------------------------------------------

constexpr size_t kRleMaxLiteral = 128;
constexpr size_t kRleMinRepeat = 3;
constexpr size_t kRleMaxRepeat = 130;

// Encoded size, or 0 when the output would exceed cap (the caller keeps a smaller candidate).
size_t rle_encode(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
    size_t out = 0, i = 0, lit = 0;
    auto flush_literals = [&](size_t end) {
        while (lit < end) {
            const size_t len = std::min(kRleMaxLiteral, end - lit);
            if (cap - out < len + 1) return false;
            dst[out++] = static_cast<uint8_t>(len - 1);
            std::memcpy(dst + out, src + lit, len);
            out += len;
            lit += len;
        }
        return true;
    };
    while (i < n) {
        size_t run = 1;
        while (i + run < n && run < kRleMaxRepeat && src[i + run] == src[i]) ++run;
        if (run < kRleMinRepeat) {
            i += run;
            continue;
        }
        if (!flush_literals(i) || cap - out < 2) return 0;
        dst[out++] = static_cast<uint8_t>(run - kRleMinRepeat + 128);
        dst[out++] = src[i];
        i += run;
        lit = i;
    }
    return flush_literals(n) ? out : 0;
}

bool rle_decode(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n) {
    size_t in = 0, out = 0;
    while (in < n) {
        const uint8_t c = src[in++];
        if (c < 128) {
            const size_t len = size_t{c} + 1;
            if (n - in < len || out_n - out < len) return false;
            std::memcpy(dst + out, src + in, len);
            in += len;
            out += len;
        } else {
            const size_t len = size_t{c} - 128 + kRleMinRepeat;
            if (in == n || out_n - out < len) return false;
            std::memset(dst + out, src[in++], len);
            out += len;
        }
    }
    return out == out_n;
}

// --- order-0 entropy estimates ------------------------------------------------------------------

// c * log2(c) for the counts of a histogram, tabulated for the common block sizes.
class CLogC {
public:
    CLogC() {
        table_[0] = 0.f;
        for (size_t c = 1; c < kSize; ++c) table_[c] = static_cast<float>(c * std::log2(double(c)));
    }
    float operator()(uint32_t c) const {
        return c < kSize ? table_[c] : static_cast<float>(c * std::log2(double(c)));
    }

private:
    static constexpr size_t kSize = 1 << 14;
    float table_[kSize];
};

// Order-0 entropy in bits per byte of the bytes counted in `hist` (`total` of them), with the
// Miller-Madow correction: the plain estimate from a sample is biased low by about
// (symbols seen - 1) / (2 total ln 2), which would make noise look compressible.
double entropy_bits_per_byte(const uint32_t* hist, uint64_t total) {
    static const CLogC clogc;
    if (total == 0) return 0;
    // Without a branch on empty bins (clogc(0) = 0): which bins are empty is irregular.
    float sum[4] = {};
    int seen = 0;
    for (int v = 0; v < 256; v += 4) {
        for (int k = 0; k < 4; ++k) {
            sum[k] += clogc(hist[v + k]);
            seen += hist[v + k] != 0;
        }
    }
    const double n = static_cast<double>(total);
    const double sum_clogc = double(sum[0]) + sum[1] + sum[2] + sum[3];
    return std::log2(n) - sum_clogc / n + (seen - 1) / (2 * n * std::log(2.0));
}

}  // namespace

bool row_bytes(ElementType t, uint64_t channels, uint64_t* bytes) {
    if (channels > (UINT64_MAX >> 3)) return false;
    switch (t) {
        case ElementType::F16:
        case ElementType::BF16: *bytes = 2 * channels; return true;
        case ElementType::F32: *bytes = 4 * channels; return true;
        case ElementType::Q8:
        case ElementType::Q4: {
            if (channels % kQuantGroup) return false;
            const uint64_t codes = t == ElementType::Q8 ? channels : channels / 2;
            *bytes = codes + 2 * (channels / kQuantGroup);
            return true;
        }
    }
    return false;
}

size_t max_encoded_size(ElementType type, const Shape& shape, uint32_t block_tokens) {
    Geometry g;
    if (!valid_element_type(static_cast<uint8_t>(type)) ||
        !make_geometry(type, shape, effective_block_tokens(shape, block_tokens), &g))
        return 0;
    const uint64_t blocks_per_slice = (g.tokens + g.block_tokens - 1) / g.block_tokens;
    // Every stream is at most its plain bytes (the encoder stores what does not shrink); a dedup
    // slice has a map stream but no more blocks or plane bytes than a plain one.
    const uint64_t map = kStreamHeaderSize + g.tokens * g.map_width;
    const uint64_t per_slice = 1 + map + blocks_per_slice * g.planes * kStreamHeaderSize + g.slice_bytes;
    return static_cast<size_t>(header_size(shape.ndim) + g.slices * per_slice);
}

// --- the codec ----------------------------------------------------------------------------------

struct detail::Scratch {
    zstd::CompressContext cctx;
    zstd::DecompressContext dctx;
    rans::Encoder rans_enc;
    rans::Decoder rans_dec;
    std::vector<uint8_t> planes[kMaxPlanes];  // one block's planes, n x width each
    std::vector<uint8_t> predicted;  // a predictor's output (with centre references)
    std::vector<uint8_t> zstd_out;   // each backend's output (the best so far is kept)
    std::vector<uint8_t> rans_out;
    std::vector<uint8_t> rle_out;
    std::vector<uint32_t> probe;     // has_long_repeats: position + 1 per hashed 8-byte key
    std::vector<uint64_t> field_sums;  // per channel: exponent fields and sign bits, summed
    std::vector<uint8_t> refs;
    // dedup
    std::vector<uint32_t> table;     // open-addressing hash table of unique rows (index + 1)
    std::vector<uint64_t> hashes;    // per unique row
    std::vector<uint32_t> first;     // per unique row: the token where it first occurs
    std::vector<uint32_t> map;       // per token: its unique row
    std::vector<uint32_t> prev_map;  // encoder: the previous slice's map, if it had one
    std::vector<uint8_t> map_bytes;  // the map stream's raw content
    std::vector<uint8_t> unique_rows;
};

namespace {

using detail::Scratch;

template <typename T>
T* sized(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

}  // namespace

Codec::Codec(const EncodeOptions& options) : options_(options), s_(new Scratch) {}
Codec::~Codec() = default;

namespace {

// --- encoder ------------------------------------------------------------------------------------

struct EncodeJob {
    Scratch* s;
    const EncodeOptions* opt;
    const Geometry* g;
    Writer* w;
    bool prev_dedup = false;  // the previous slice of this frame has a map (in s->prev_map)
};

void write_stream_header(Writer& w, Predictor p, Backend b, uint32_t raw_len, uint32_t payload_len) {
    w.u8(static_cast<uint8_t>(p));
    w.u8(static_cast<uint8_t>(b));
    w.u32(raw_len);
    w.u32(payload_len);
}

// True when the 8 bytes at some 8-byte aligned position of p[0, n) occur at an earlier aligned
// position (as far as a hash table of at most 2^16 positions remembers). Such repeats are what
// lets an LZ coder (zstd) beat order-0 coding: on KV planes every stream where zstd beat rANS by
// more than 20 bytes had one, and only about 4 % of the others. (KV planes repeat whole rows, and
// rows of a multiple of 8 channels keep repeats aligned.)
bool has_long_repeats(Scratch& s, const uint8_t* p, size_t n) {
    if (n < 16) return false;
    const size_t positions = n / 8;
    uint32_t bits = 10;
    while (bits < 16 && (size_t{1} << bits) < 2 * positions) ++bits;
    uint32_t* table = sized(s.probe, size_t{1} << bits);
    std::fill(table, table + (size_t{1} << bits), 0u);
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t key;
        std::memcpy(&key, p + i, 8);
        const size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
        if (table[h]) {
            uint64_t earlier;
            std::memcpy(&earlier, p + (table[h] - 1), 8);
            if (earlier == key) return true;
        }
        table[h] = static_cast<uint32_t>(i + 1);
    }
    return false;
}

// zstd's fast levels (1-3: strategies fast and dfast) size their hash table for throughput, 2^14
// entries at level 1, so on a 128 KiB plane they forget most earlier rows, while KV planes
// compress by repeating earlier rows. A table of one entry per two positions, and matches from 5
// bytes, made the layer 0-1 planes zstd codes 1.9 % smaller at level 1 (SmolLM2, 2048 tokens),
// with zstd ~15 % slower on them and the whole encoder no slower measurably (zstd is tried on
// few streams). Higher levels search well enough on their own.
zstd::Params zstd_params(int level, size_t n) {
    zstd::Params p;
    p.level = level;
    if (level < 1 || level > 3) return p;
    int log2n = 0;
    while ((size_t{2} << log2n) <= n) ++log2n;  // floor(log2(n))
    if (log2n - 1 > 14) p.hash_log = std::min(log2n - 1, 20);
    p.min_match = 5;
    return p;
}

// Writes `raw` (the output of predictor p, plain plane bytes `plain` when p is not Raw; byte i in
// column i mod `columns`) with the backend that makes it smallest; a stream no backend shrinks is
// written raw and stored.
void write_stream(EncodeJob& j, Predictor p, const uint8_t* raw, uint32_t raw_len, size_t columns,
                  const uint8_t* plain, uint32_t plain_len, double estimated_bits) {
    Scratch& s = *j.s;
    Backend best = Backend::Stored;
    size_t best_len = plain_len;
    const uint8_t* best_payload = plain;
    const bool worth_trying =
        raw_len > 0 && plain_len > 0 && estimated_bits < kIncompressibleBitsPerByte * raw_len;
    // The rANS size is estimated from the stream's histogram before coding.
    const size_t rans_size =
        worth_trying && j.opt->allow_rans ? s.rans_enc.plan(raw, raw_len, columns) : SIZE_MAX;
    // zstd costs as much time as the rest of the encoder; against rANS it can only win by long
    // repeats (its Huffman coding of literals is order-0 too), so it is tried when there are some.
    if (worth_trying && j.opt->allow_zstd && (rans_size == SIZE_MAX || has_long_repeats(s, raw, raw_len))) {
        uint8_t* dst = sized(s.zstd_out, raw_len);
        const size_t n = s.cctx.compress(dst, best_len - 1, raw, raw_len, zstd_params(j.opt->zstd_level, raw_len));
        if (n > 0 && n < best_len) {
            best = Backend::Zstd;
            best_len = n;
            best_payload = dst;
        }
    }
    if (rans_size < best_len) {
        uint8_t* dst = sized(s.rans_out, best_len);
        const size_t n = s.rans_enc.encode(raw, raw_len, columns, dst, best_len - 1);
        if (n > 0 && raw_len <= kMaxExpansion * n) {
            best = Backend::Rans;
            best_len = n;
            best_payload = dst;
        }
    }
    // Every run costs at least one byte, so RLE cannot win with as many runs as the best size.
    if (worth_trying && j.opt->allow_rle && kernels::count_runs(raw, raw_len) < best_len) {
        uint8_t* dst = sized(s.rle_out, raw_len);
        const size_t n = rle_encode(raw, raw_len, dst, best_len - 1);
        if (n > 0) {
            best = Backend::Rle;
            best_len = n;
            best_payload = dst;
        }
    }
    if (best == Backend::Stored) {
        write_stream_header(*j.w, Predictor::Raw, Backend::Stored, plain_len, plain_len);
        j.w->bytes(plain, plain_len);
        return;
    }
    write_stream_header(*j.w, p, best, raw_len, static_cast<uint32_t>(best_len));
    j.w->bytes(best_payload, best_len);
}

// Picks the allowed predictor whose output has the smallest order-0 entropy for plane P (n x C),
// writes its output to s.predicted (unless raw) and returns it with its length and estimated
// size in bits. The entropies are estimated on a quarter of the rows, which ranks the
// predictors just as well at a quarter of the cost of histograms.
Predictor choose_predictor(EncodeJob& j, const uint8_t* P, size_t n, size_t C, bool top,
                           uint32_t* out_len, double* out_bits) {
    Scratch& s = *j.s;
    const uint32_t allowed = j.opt->predictors | predictor_bit(Predictor::Raw);
    const uint8_t mask = exponent_field_mask(j.g->type);
    // Centre costs C reference bytes; with a single row it cannot pay.
    const bool try_centre = top && (allowed & predictor_bit(Predictor::Centre)) && n > 1;
    uint8_t* refs = nullptr;
    if (try_centre) {
        refs = sized(s.refs, C);
        kernels::centre_references(P, n, C, mask, sized(s.field_sums, 2 * C), refs);
    }
    uint32_t hist[4][256] = {};
    const uint64_t sampled = kernels::sample_histograms(P, n, C, refs, mask, hist);
    const uint64_t total = uint64_t(n) * C;
    Predictor best = Predictor::Raw;
    double best_bits = entropy_bits_per_byte(hist[0], sampled) * total;
    for (Predictor p : {Predictor::Xor, Predictor::Delta, Predictor::Centre}) {
        if (!(allowed & predictor_bit(p)) || (p == Predictor::Centre && !try_centre)) continue;
        const double b = entropy_bits_per_byte(hist[static_cast<int>(p)], sampled) * total +
                         (p == Predictor::Centre ? 8.0 * C : 0.0);
        if (b < best_bits) best_bits = b, best = p;
    }
    *out_bits = best_bits;
    *out_len = static_cast<uint32_t>(total);
    if (best == Predictor::Centre) {
        uint8_t* out = sized(s.predicted, total + C);
        std::memcpy(out, refs, C);
        kernels::centre_forward(P, n, C, refs, mask, out + C);
        *out_len += static_cast<uint32_t>(C);
    } else if (best != Predictor::Raw) {
        kernels::delta_forward(P, n, C, best == Predictor::Xor, sized(s.predicted, total));
    }
    return best;
}

void encode_block(EncodeJob& j, const uint8_t* rows, size_t n) {
    Scratch& s = *j.s;
    const Geometry& g = *j.g;
    uint8_t* planes[kMaxPlanes];
    for (size_t k = 0; k < g.planes; ++k) planes[k] = sized(s.planes[k], n * g.width[k]);
    if (quantised(g.type))
        kernels::split_quant_rows(rows, n, g.width[0], g.width[1], planes);
    else
        kernels::split_planes(rows, n * g.channels, g.planes, planes);
    for (size_t k = 0; k < g.planes; ++k) {
        const size_t C = g.width[k], plane_len = n * C;
        uint32_t raw_len;
        double bits;
        const Predictor p = choose_predictor(j, planes[k], n, C, k + 1 == g.planes, &raw_len, &bits);
        const uint8_t* raw = p == Predictor::Raw ? planes[k] : s.predicted.data();
        write_stream(j, p, raw, raw_len, C, planes[k], static_cast<uint32_t>(plane_len), bits);
    }
}

// Finds repeated rows of a slice: s.map[t] is token t's unique row, s.first[u] the first token
// with unique row u. Returns the number of unique rows.
size_t find_unique_rows(Scratch& s, const uint8_t* rows, size_t tokens, size_t row_bytes) {
    size_t cap = 16;
    while (cap < 2 * tokens) cap *= 2;
    uint32_t* table = sized(s.table, cap);
    std::fill(table, table + cap, 0u);
    uint64_t* hashes = sized(s.hashes, tokens);
    uint32_t* first = sized(s.first, tokens);
    uint32_t* map = sized(s.map, tokens);
    size_t unique = 0;
    for (size_t t = 0; t < tokens; ++t) {
        const uint8_t* row = rows + t * row_bytes;
        const uint64_t h = xxh64(row, row_bytes);
        size_t slot = h & (cap - 1);
        for (;; slot = (slot + 1) & (cap - 1)) {
            if (table[slot] == 0) {
                table[slot] = static_cast<uint32_t>(unique + 1);
                hashes[unique] = h;
                first[unique] = static_cast<uint32_t>(t);
                map[t] = static_cast<uint32_t>(unique++);
                break;
            }
            const uint32_t u = table[slot] - 1;
            if (hashes[u] == h && !std::memcmp(rows + size_t{first[u]} * row_bytes, row, row_bytes)) {
                map[t] = u;
                break;
            }
        }
    }
    return unique;
}

void encode_slice(EncodeJob& j, const uint8_t* slice) {
    Scratch& s = *j.s;
    const Geometry& g = *j.g;
    const size_t tokens = g.tokens, row_bytes = g.row_bytes;
    const uint8_t* rows = slice;
    size_t n_rows = tokens;
    bool dedup = false;
    // (A map must fit a u32 raw_len: slices of over 2^30 tokens are not deduplicated.)
    if (j.opt->dedup && tokens > 1 && row_bytes > 0 && tokens * g.map_width <= UINT32_MAX) {
        const size_t unique = find_unique_rows(s, slice, tokens, row_bytes);
        // Worth it when the repeated rows hold more bytes than the map costs before compression.
        dedup = (tokens - unique) * row_bytes > tokens * g.map_width;
        if (dedup) {
            uint8_t* u = sized(s.unique_rows, unique * row_bytes);
            for (size_t i = 0; i < unique; ++i)
                std::memcpy(u + i * row_bytes, slice + size_t{s.first[i]} * row_bytes, row_bytes);
            rows = u;
            n_rows = unique;
        }
    }
    // The heads of layer 0 repeat the same tokens, so their maps are usually identical.
    const bool same_map =
        dedup && j.prev_dedup && std::equal(s.map.begin(), s.map.begin() + tokens, s.prev_map.begin());
    j.w->u8(dedup ? (same_map ? kSliceDedup | kSliceSameMap : kSliceDedup) : 0);
    j.prev_dedup = dedup;
    if (dedup && !same_map) {
        std::copy(s.map.begin(), s.map.begin() + tokens, sized(s.prev_map, tokens));
        const size_t w = g.map_width, len = tokens * w;
        uint8_t* m = sized(s.map_bytes, len);
        for (size_t t = 0; t < tokens; ++t) {
            const uint32_t v = s.map[t];
            std::memcpy(m + t * w, &v, w);  // little-endian: the low w bytes
        }
        uint32_t hist[256] = {};
        for (size_t i = 0; i < len; ++i) ++hist[m[i]];
        write_stream(j, Predictor::Raw, m, static_cast<uint32_t>(len), 1, m, static_cast<uint32_t>(len),
                     entropy_bits_per_byte(hist, len) * len);
    }
    for (size_t b = 0; b < n_rows; b += g.block_tokens) {
        const size_t n = std::min<size_t>(g.block_tokens, n_rows - b);
        encode_block(j, rows + b * row_bytes, n);
    }
}

// --- decoder ------------------------------------------------------------------------------------

Status parse_header(Reader& r, FrameInfo* fi, Geometry* g) {
    const uint8_t* h;
    if (!r.take(8, &h)) return Status::Truncated;
    if (std::memcmp(h, kMagic, 4)) return Status::BadMagic;
    if (h[4] != kVersion) return Status::BadVersion;
    const uint8_t type = h[5], ndim = h[6];
    if (!valid_element_type(type) || ndim < 1 || ndim > kMaxDims || h[7] != 0) return Status::BadHeader;
    uint32_t block_tokens;
    if (!r.u32(&block_tokens)) return Status::Truncated;
    fi->shape.ndim = ndim;
    for (uint32_t i = 0; i < ndim; ++i) {
        if (!r.u32(&fi->shape.dims[i])) return Status::Truncated;
    }
    uint64_t checksum;
    uint32_t check;
    if (!r.u64(&checksum) || !r.u32(&check)) return Status::Truncated;
    const size_t hs = header_size(ndim);
    if (check != static_cast<uint32_t>(xxh64(h, hs - 4))) return Status::BadHeader;
    fi->element_type = static_cast<ElementType>(type);
    if (!make_geometry(fi->element_type, fi->shape, block_tokens, g)) return Status::BadHeader;
    fi->block_tokens = block_tokens;
    fi->data_checksum = checksum;
    fi->header_size = hs;
    fi->decoded_size = static_cast<size_t>(g->total_bytes);
    return Status::Ok;
}

struct StreamHeader {
    Predictor predictor;
    Backend backend;
    uint32_t raw_len;
    const uint8_t* payload;
    uint32_t payload_len;
};

// Reads one stream header and its payload, checked against the geometry: `base_len` bytes for the
// plane (plus C references with the centre predictor, allowed on the top plane only).
Status read_stream(Reader& r, uint64_t base_len, uint64_t C, bool top, bool map, StreamHeader* st) {
    uint8_t p, b;
    uint32_t payload_len;
    if (!r.u8(&p) || !r.u8(&b) || !r.u32(&st->raw_len) || !r.u32(&payload_len)) return Status::Truncated;
    if (!r.take(payload_len, &st->payload)) return Status::Truncated;
    st->payload_len = payload_len;
    const bool centre = p == static_cast<uint8_t>(Predictor::Centre);
    if (p > 3 || (centre && !top) || (map && p != 0) || b > 3) return Status::Corrupt;
    if (st->raw_len != base_len + (centre ? C : 0)) return Status::Corrupt;
    if (b == static_cast<uint8_t>(Backend::Stored) && payload_len != st->raw_len) return Status::Corrupt;
    // No valid payload expands more than this (RLE: 2 bytes make at most 130; zstd: a 4-byte RLE
    // block makes at most 128 KiB; rANS: a limit of the format). Checking it first bounds what a
    // hostile frame can make the decoder allocate.
    const uint64_t max_expansion = b == static_cast<uint8_t>(Backend::Rle) ? 65 : kMaxExpansion;
    if (st->raw_len > max_expansion * payload_len) return Status::Corrupt;
    st->predictor = static_cast<Predictor>(p);
    st->backend = static_cast<Backend>(b);
    return Status::Ok;
}

// Runs the backend of a stream (byte i in column i mod `columns`): its raw bytes, in place in the
// frame when stored, else in dst.
Status unpack(Scratch& s, const StreamHeader& st, size_t columns, uint8_t* dst, const uint8_t** raw) {
    switch (st.backend) {
        case Backend::Stored:
            *raw = st.payload;
            return Status::Ok;
        case Backend::Rle:
            if (!rle_decode(st.payload, st.payload_len, dst, st.raw_len)) return Status::Corrupt;
            break;
        case Backend::Zstd:
            if (!s.dctx.available()) return Status::ZstdUnavailable;
            if (!s.dctx.decompress_exact(dst, st.raw_len, st.payload, st.payload_len)) return Status::Corrupt;
            break;
        case Backend::Rans:
            if (!s.rans_dec.decode(st.payload, st.payload_len, dst, st.raw_len, columns)) return Status::Corrupt;
            break;
    }
    *raw = dst;
    return Status::Ok;
}

// Decodes the dedup map of a slice into s.map and returns the number of unique rows in *unique.
Status decode_map(Scratch& s, Reader& r, const Geometry& g, StreamHeader* st, size_t* unique) {
    const size_t w = g.map_width, len = g.tokens * w;
    if (Status e = read_stream(r, len, 0, false, true, st); e != Status::Ok) return e;
    const uint8_t* m;
    if (Status e = unpack(s, *st, 1, sized(s.map_bytes, len), &m); e != Status::Ok) return e;
    uint32_t* map = sized(s.map, g.tokens);
    size_t next = 0;  // unique rows seen so far
    for (size_t t = 0; t < g.tokens; ++t) {
        uint32_t v = 0;
        std::memcpy(&v, m + t * w, w);
        if (v > next) return Status::Corrupt;  // first-occurrence order is required
        next += v == next;
        map[t] = v;
    }
    *unique = next;
    return Status::Ok;
}

struct DecodeJob {
    Scratch* s;
    const Geometry* g;
    Reader* r;
    std::vector<StreamInfo>* streams;  // inspect() only: record, don't decode planes
    uint32_t slice;
    size_t prev_unique = 0;  // unique rows of the previous slice's map (in s->map); 0: no map
};

Status decode_block(DecodeJob& j, size_t n, int32_t block, uint8_t* dst) {
    Scratch& s = *j.s;
    const Geometry& g = *j.g;
    const uint8_t* planes[kMaxPlanes];
    for (size_t k = 0; k < g.planes; ++k) {
        const size_t C = g.width[k], plane_len = n * C;
        StreamHeader st;
        const bool top = k + 1 == g.planes;
        if (Status e = read_stream(*j.r, plane_len, C, top, false, &st); e != Status::Ok) return e;
        if (j.streams) {
            j.streams->push_back({j.slice, block, static_cast<uint32_t>(k), st.predictor, st.backend,
                                  st.raw_len, st.payload_len});
            continue;
        }
        uint8_t* plane = sized(s.planes[k], plane_len);
        const uint8_t* raw;
        if (st.predictor == Predictor::Raw) {
            if (Status e = unpack(s, st, C, plane, &raw); e != Status::Ok) return e;
            planes[k] = raw;
            continue;
        }
        if (Status e = unpack(s, st, C, sized(s.predicted, st.raw_len), &raw); e != Status::Ok) return e;
        if (st.predictor == Predictor::Centre)
            kernels::centre_inverse(raw + C, n, C, raw, exponent_field_mask(g.type), plane);
        else
            kernels::delta_inverse(raw, n, C, st.predictor == Predictor::Xor, plane);
        planes[k] = plane;
    }
    if (j.streams) return Status::Ok;
    if (quantised(g.type))
        kernels::merge_quant_rows(planes, n, g.width[0], g.width[1], dst);
    else
        kernels::merge_planes(planes, n * g.channels, g.planes, dst);
    return Status::Ok;
}

Status decode_slice(DecodeJob& j, uint8_t* out) {
    Scratch& s = *j.s;
    const Geometry& g = *j.g;
    uint8_t flags;
    if (!j.r->u8(&flags)) return Status::Truncated;
    if (flags & ~(kSliceDedup | kSliceSameMap)) return Status::Corrupt;
    const bool dedup = flags & kSliceDedup, same_map = flags & kSliceSameMap;
    if (dedup && g.row_bytes == 0) return Status::Corrupt;  // encoders never dedup empty rows
    // A shared map needs a map to share: s.map still holds the previous slice's.
    if (same_map && (!dedup || j.prev_unique == 0)) return Status::Corrupt;
    size_t rows = g.tokens;
    if (same_map) {
        rows = j.prev_unique;
        if (j.streams) j.streams->push_back({j.slice, -1, 0, Predictor::Raw, Backend::Stored, 0, 0});
    } else if (dedup) {
        StreamHeader st;
        if (Status e = decode_map(s, *j.r, g, &st, &rows); e != Status::Ok) return e;
        if (j.streams)
            j.streams->push_back({j.slice, -1, 0, st.predictor, st.backend, st.raw_len, st.payload_len});
    }
    j.prev_unique = dedup ? rows : 0;
    uint8_t* rows_out = dedup && !j.streams ? sized(s.unique_rows, rows * g.row_bytes) : out;
    for (size_t b = 0, i = 0; b < rows; b += g.block_tokens, ++i) {
        const size_t n = std::min<size_t>(g.block_tokens, rows - b);
        uint8_t* dst = j.streams ? nullptr : rows_out + b * g.row_bytes;
        if (Status e = decode_block(j, n, static_cast<int32_t>(i), dst); e != Status::Ok) return e;
    }
    if (dedup && !j.streams) {
        for (size_t t = 0; t < g.tokens; ++t)
            std::memcpy(out + t * g.row_bytes, rows_out + size_t{s.map[t]} * g.row_bytes, g.row_bytes);
    }
    return Status::Ok;
}

}  // namespace

Status read_frame_info(const uint8_t* frame, size_t size, FrameInfo* info) {
    Reader r(frame, size);
    Geometry g;
    FrameInfo fi;
    const Status e = parse_header(r, &fi, &g);
    if (e == Status::Ok && info) *info = fi;
    return e;
}

Status Codec::encode(const void* data, ElementType type, const Shape& shape, uint8_t* out,
                     size_t capacity, size_t* written) {
    const uint32_t block_tokens = effective_block_tokens(shape, options_.block_tokens);
    Geometry g;
    if (!valid_element_type(static_cast<uint8_t>(type)) || !make_geometry(type, shape, block_tokens, &g))
        return Status::InvalidArgument;
    if (g.total_bytes && !data) return Status::InvalidArgument;
    Writer w(out, capacity);
    uint8_t* h = w.reserve(header_size(shape.ndim));
    if (!h) return Status::OutputTooSmall;
    const size_t hs = header_size(shape.ndim);
    std::memcpy(h, kMagic, 4);
    h[4] = kVersion;
    h[5] = static_cast<uint8_t>(type);
    h[6] = static_cast<uint8_t>(shape.ndim);
    h[7] = 0;
    std::memcpy(h + 8, &block_tokens, 4);
    std::memcpy(h + 12, shape.dims, 4 * size_t{shape.ndim});
    const uint64_t checksum = xxh64(data, g.total_bytes);
    std::memcpy(h + hs - 12, &checksum, 8);
    const uint32_t check = static_cast<uint32_t>(xxh64(h, hs - 4));
    std::memcpy(h + hs - 4, &check, 4);
    EncodeJob j{s_.get(), &options_, &g, &w};
    for (uint64_t i = 0; i < g.slices && w.ok(); ++i)
        encode_slice(j, static_cast<const uint8_t*>(data) + i * g.slice_bytes);
    if (!w.ok()) return Status::OutputTooSmall;
    *written = w.pos();
    return Status::Ok;
}

Status Codec::encode(const void* data, ElementType type, const Shape& shape, std::vector<uint8_t>* out) {
    const uint32_t bt = options_.block_tokens;
    out->resize(std::max<size_t>(max_encoded_size(type, shape, bt), 1));
    size_t written = 0;
    const Status e = encode(data, type, shape, out->data(), out->size(), &written);
    out->resize(e == Status::Ok ? written : 0);
    return e;
}

Status Codec::decode(const uint8_t* frame, size_t size, void* out, size_t capacity, FrameInfo* info) {
    Reader r(frame, size);
    FrameInfo fi;
    Geometry g;
    if (Status e = parse_header(r, &fi, &g); e != Status::Ok) return e;
    if (info) *info = fi;
    if (g.total_bytes > capacity) return Status::OutputTooSmall;
    DecodeJob j{s_.get(), &g, &r, nullptr, 0};
    for (uint64_t i = 0; i < g.slices; ++i) {
        j.slice = static_cast<uint32_t>(i);
        uint8_t* dst = static_cast<uint8_t*>(out) + i * g.slice_bytes;
        if (Status e = decode_slice(j, dst); e != Status::Ok) return e;
    }
    if (r.left()) return Status::Corrupt;
    if (xxh64(out, g.total_bytes) != fi.data_checksum) return Status::ChecksumMismatch;
    return Status::Ok;
}

Status Codec::inspect(const uint8_t* frame, size_t size, FrameInfo* info, std::vector<StreamInfo>* streams) {
    Reader r(frame, size);
    FrameInfo fi;
    Geometry g;
    if (Status e = parse_header(r, &fi, &g); e != Status::Ok) return e;
    if (info) *info = fi;
    streams->clear();
    DecodeJob j{s_.get(), &g, &r, streams, 0};
    for (uint64_t i = 0; i < g.slices; ++i) {
        j.slice = static_cast<uint32_t>(i);
        if (Status e = decode_slice(j, nullptr); e != Status::Ok) return e;
    }
    return r.left() ? Status::Corrupt : Status::Ok;
}

}  // namespace gear
}  // namespace mnn_h2o
