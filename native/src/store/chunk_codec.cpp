#include "mnn_h2o/store/chunk_codec.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "mnn_h2o/store/head_v_rows.h"
#include "mnn_h2o/cache/kv_dtype.h"
#include "mnn_h2o/store/store_clock.h"

namespace mnn_h2o::store {

namespace {

// The Gear type of the cache's rows: the rotated types' rows are q8 / q4 rows of rotated values.
gear::ElementType element_type_of(KvDtype dtype) {
    switch (kv_storage_dtype(dtype)) {
        case KvDtype::F16: return gear::ElementType::F16;
        case KvDtype::BF16: return gear::ElementType::BF16;
        case KvDtype::F32: return gear::ElementType::F32;
        case KvDtype::Q8: return gear::ElementType::Q8;
        case KvDtype::Q4: return gear::ElementType::Q4;
        default: break;
    }
    throw std::invalid_argument(std::string("LosslessStage: the lossless store does not take dtype ") + kv_dtype_name(dtype));
}

gear::EncodeOptions codec_options(const StoreConfig& c) {
    gear::EncodeOptions o;
    o.zstd_level = c.zstd_level;
    return o;
}

}  // namespace

ChunkCodec::ChunkCodec(const StoreConfig& store, const KvCacheConfig& cache)
    : options_(codec_options(store)),
      faults_(store.faults),
      block_tokens_(cache.block_tokens),
      head_dim_(cache.head_dim),
      row_bytes_(kv_row_bytes(cache.dtype, cache.head_dim)),
      block_bytes_(row_bytes_ * cache.block_tokens),
      element_type_(element_type_of(cache.dtype)) {}

// [2][n_blocks * block_tokens][head_dim]: K, then V; or K only.
gear::Shape ChunkCodec::shape(int n_blocks, bool k_only) const {
    gear::Shape shape;
    shape.ndim = 3;
    shape.dims[0] = k_only ? 1 : 2;
    shape.dims[1] = static_cast<uint32_t>(n_blocks * block_tokens_);
    shape.dims[2] = static_cast<uint32_t>(head_dim_);
    return shape;
}

Encoded ChunkCodec::encode_checked(EncodeBuffers& b, int n_blocks, bool k_only) const {
    const gear::Shape s = shape(n_blocks, k_only);
    const size_t raw_size = raw_bytes(n_blocks) / (k_only ? 2 : 1);
    b.frame.resize(gear::max_encoded_size(element_type_, s, 0));
    Encoded e;
    Clock::time_point t0 = Clock::now();
    const gear::Status status = faults_.encode_error
                                    ? gear::Status::InvalidArgument
                                    : b.codec->encode(b.raw.data(), element_type_, s, b.frame.data(), b.frame.size(), &e.size);
    e.encode_us = micros_since(t0);
    e.encoded = status == gear::Status::Ok;
    if (!e.encoded) return e;
    t0 = Clock::now();
    b.check.resize(raw_size);
    e.verified = b.codec->decode(b.frame.data(), e.size, b.check.data(), raw_size) == gear::Status::Ok &&
                 std::memcmp(b.check.data(), b.raw.data(), raw_size) == 0 && !faults_.verify_mismatch;
    e.verify_us = micros_since(t0);
    return e;
}

bool ChunkCodec::decode_frame(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const {
    const size_t bytes = raw_bytes(chunk.n_blocks) / (chunk.ref_width ? 2 : 1);
    return codec.decode(chunk.blob.data(), chunk.frame_size, out, bytes) == gear::Status::Ok;
}

void ChunkCodec::gather_v(const Chunk& chunk, uint8_t* out) const {
    uint8_t* v = out + static_cast<size_t>(chunk.n_blocks) * block_bytes_;
    const uint8_t* refs = chunk.blob.data() + chunk.frame_size;
    const int w = chunk.ref_width;
    for (size_t i = 0, n = static_cast<size_t>(chunk.n_blocks) * block_tokens_; i < n; ++i) {
        const uint32_t ref = read_row_ref(refs + i * w, w);
        if (ref >= chunk.table->size()) throw std::runtime_error("LosslessStage: a V row reference is out of range");
        std::memcpy(v + i * row_bytes_, chunk.table->row(ref), row_bytes_);
    }
}

void ChunkCodec::decode(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const {
    if (!decode_frame(chunk, out, codec))
        throw std::runtime_error("LosslessStage: a verified frame no longer decodes (memory corrupted?)");
    if (chunk.ref_width) gather_v(chunk, out);
}

}  // namespace mnn_h2o::store
