// A chunk's frame (store_chunk.h) in and out of the Gear codec: its shape, encoding checked by
// decoding it again (verify before free), and decoding with a dedup chunk's V rows gathered from
// its table. Every method touches only its arguments, so any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/store/store_chunk.h"
#include "mnn_h2o/store/store_config.h"

namespace mnn_h2o::store {

// What one thread needs to encode: its codec and buffers, reused from chunk to chunk.
struct EncodeBuffers {
    explicit EncodeBuffers(const gear::EncodeOptions& options)
        : options(options), codec(std::make_unique<gear::Codec>(options)) {}
    // Gives back the buffers and the codec's own scratch (the cache is being emptied).
    void release() {
        codec = std::make_unique<gear::Codec>(options);
        raw = std::vector<uint8_t>();  // (`= {}` would keep the capacity)
        frame = std::vector<uint8_t>();
        check = std::vector<uint8_t>();
    }
    size_t bytes() const { return raw.capacity() + frame.capacity() + check.capacity(); }

    const gear::EncodeOptions options;
    std::unique_ptr<gear::Codec> codec;
    std::vector<uint8_t> raw;    // the chunk gathered from its blocks, K then V
    std::vector<uint8_t> frame;  // encoder output, worst-case sized
    std::vector<uint8_t> check;  // the frame decoded again
};

struct Encoded {
    bool encoded = false, verified = false;
    size_t size = 0;  // frame bytes in the buffers' frame
    double encode_us = 0.0, verify_us = 0.0;
};

class ChunkCodec {
public:
    // Every KV dtype has a Gear element type (the quantised rows as Q8 / Q4); throws
    // std::invalid_argument for one that would not.
    ChunkCodec(const StoreConfig& store, const KvCacheConfig& cache);

    int block_tokens() const { return block_tokens_; }
    size_t row_bytes() const { return row_bytes_; }
    size_t block_bytes() const { return block_bytes_; }
    // K and V of n_blocks blocks.
    size_t raw_bytes(int n_blocks) const { return 2 * static_cast<size_t>(n_blocks) * block_bytes_; }
    const gear::EncodeOptions& options() const { return options_; }
    std::unique_ptr<EncodeBuffers> buffers() const { return std::make_unique<EncodeBuffers>(options_); }
    std::unique_ptr<gear::Codec> decoder() const { return std::make_unique<gear::Codec>(options_); }

    // Encodes b.raw, a chunk of n_blocks (k_only: its first half), into b.frame and decodes the
    // frame back into b.check to compare. The store's injected encode and verify faults act here.
    Encoded encode_checked(EncodeBuffers& b, int n_blocks, bool k_only) const;
    // The frame alone into out (K, then V unless the chunk refers to V rows); false on an error.
    bool decode_frame(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const;
    // The whole chunk, [2][n_blocks][block]; throws if a verified frame no longer decodes. Reads
    // a dedup chunk's table: not while rows are being added to it.
    void decode(const Chunk& chunk, uint8_t* out, gear::Codec& codec) const;
    // A dedup chunk's V rows from its table into out's V half (after decode_frame).
    void gather_v(const Chunk& chunk, uint8_t* out) const;

private:
    gear::Shape shape(int n_blocks, bool k_only) const;

    const gear::EncodeOptions options_;
    const StoreFaults faults_;
    const int block_tokens_, head_dim_;
    const size_t row_bytes_, block_bytes_;
    const gear::ElementType element_type_;
};

}  // namespace mnn_h2o::store
