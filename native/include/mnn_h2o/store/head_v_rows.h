// The V row table of one kv head in the store's V dedup layers (docs/kv_cache.md "V row
// tables"): the distinct rows (row_table.h) that the head's chunks refer to instead of holding V,
// and how many references the chunks have dropped since the table was last compacted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "mnn_h2o/store/row_table.h"
#include "mnn_h2o/store/store_chunk.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/store/store_stats.h"

namespace mnn_h2o::store {

// A reference to a table row: width (2 or 4) bytes, little-endian.
inline uint32_t read_row_ref(const uint8_t* p, int width) {
    uint32_t x = 0;
    for (int i = 0; i < width; ++i) x |= static_cast<uint32_t>(p[i]) << (8 * i);
    return x;
}

inline void write_row_ref(uint8_t* p, int width, uint32_t x) {
    for (int i = 0; i < width; ++i) p[i] = static_cast<uint8_t>(x >> (8 * i));
}

class HeadVRows {
public:
    // faults: alloc_failure and verify_mismatch act in add_refs().
    HeadVRows(size_t row_bytes, int block_tokens, const StoreFaults& faults)
        : row_bytes_(row_bytes), block_tokens_(block_tokens), faults_(faults) {}

    // Interns the V rows of chunk (v: its n_blocks raw blocks of V, [n_blocks * block_tokens]
    // rows), appends their indices to its blob after the K frame and checks that the table gives
    // back exactly these rows (verify before free). On a fallback (memory, or the check) the
    // chunk must not be installed; rows it added stay unreferenced until the next compaction.
    std::optional<StoreFallback> add_refs(Chunk& chunk, const uint8_t* v);
    // A chunk went, or lost frame blocks: its references to n_rows rows are gone.
    void drop(size_t n_rows) { dropped_refs_ += n_rows; }
    // Once the head has dropped as many references as half the rows (or chunks is empty), removes
    // the rows nothing refers to and renumbers the references of chunks (the head's chunks).
    void compact(const std::vector<std::unique_ptr<Chunk>>& chunks);
    void clear();

    size_t rows() const { return table_ ? table_->size() : 0; }
    size_t bytes() const { return table_ ? table_->bytes() : 0; }

private:
    const size_t row_bytes_;
    const int block_tokens_;
    const StoreFaults faults_;
    std::unique_ptr<RowTable> table_;  // made by the first chunk
    size_t dropped_refs_ = 0;
};

}  // namespace mnn_h2o::store
