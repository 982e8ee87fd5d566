// A compressed run of blocks of one kv head, as the lossless store holds it, and the states a
// block of a head goes through (docs/kv_cache.md "Lossless store").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "mnn_h2o/store/row_table.h"

namespace mnn_h2o::store {

// What a block of a head is to the store.
enum BlockState : uint8_t {
    kRaw = 0,  // raw; becomes part of a chunk once cold
    kQueued,   // raw; a job is encoding its chunk
    kStored,   // compressed: null in the head's lists, its bytes in a chunk's frame
    kSettled,  // raw for good: measured (probe, full) or left raw by a fallback, never retried
};

// 64-byte aligned bytes, like pool blocks: the attention kernels read decoded chunks as blocks.
struct AlignedBytes {
    explicit AlignedBytes(size_t n)
        : data(static_cast<uint8_t*>(::operator new(n, std::align_val_t(64)))), size(n) {}
    ~AlignedBytes() { ::operator delete(data, std::align_val_t(64)); }
    AlignedBytes(const AlignedBytes&) = delete;
    AlignedBytes& operator=(const AlignedBytes&) = delete;
    uint8_t* const data;
    const size_t size;
};

struct Job;

// One frame of [2][n_blocks * block_tokens][head_dim] (K then V). In a V dedup layer the frame
// holds K only, [1][n_blocks * block_tokens][head_dim], and the blob goes on with one index into
// the head's row table per V row (ref_width bytes each, little-endian; head_v_rows.h).
struct Chunk {
    int first = 0;          // position of its first live block in the head's lists
    int n_blocks = 0;       // blocks in the frame
    std::vector<int> live;  // frame blocks the head still holds, at positions first, first+1, ...
    std::vector<uint8_t> blob;
    size_t frame_size = 0;            // the frame: blob[0, frame_size)
    int ref_width = 0;                // 0: V is in the frame; 2 or 4: V row indices follow it
    const RowTable* table = nullptr;  // with ref_width: the head's table
    // Decode cache state (decode_cache.h).
    std::unique_ptr<AlignedBytes> decoded;  // its entry, [2][n_blocks][block] (K then V)
    Job* prefetch = nullptr;                // a prefetch job that may still fill `decoded`
    uint64_t batch = 0;                     // the decode batch it is in
    size_t batch_offset = 0;                // ... and where in scratch its bytes are

    int end() const { return first + static_cast<int>(live.size()); }  // past its last live block
};

}  // namespace mnn_h2o::store
