// The distinct rows of one kv head's V, for the KV store's layers where rows repeat exactly (in
// layer 0, V is a function of the token id alone, so every repeated token repeats its row). Each
// distinct row is held once; chunks refer to rows by index.
//
// Rows live in pages of kPageRows, so the table grows without moving or over-allocating rows; an
// open-addressing hash set of row indices finds a row by its bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace mnn_h2o {

class RowTable {
public:
    static constexpr uint32_t kPageRows = 64;

    explicit RowTable(size_t row_bytes) : row_bytes_(row_bytes) {}

    size_t size() const { return n_rows_; }
    size_t row_bytes() const { return row_bytes_; }
    const uint8_t* row(uint32_t index) const {
        return pages_[index / kPageRows].get() + static_cast<size_t>(index % kPageRows) * row_bytes_;
    }

    // The index of a row with these bytes, added if the table has none. Throws std::bad_alloc
    // (the table unchanged) when memory cannot be had.
    uint32_t intern(const uint8_t* row);

    // Keeps the rows whose live flag is set (live.size() == size()), in order; (*remap)[i] gets
    // the new index of kept row i. Throws std::bad_alloc (the table unchanged).
    void compact(const std::vector<uint8_t>& live, std::vector<uint32_t>* remap);

    void clear();

    // Pages and hash slots (what the table holds).
    size_t bytes() const {
        return pages_.size() * kPageRows * row_bytes_ + slots_.capacity() * sizeof(uint32_t) +
               pages_.capacity() * sizeof(pages_[0]);
    }

private:
    uint64_t hash(const uint8_t* row) const;
    void rehash(std::vector<uint32_t>& slots) const;  // fills slots (all zero) with every row

    size_t row_bytes_;
    size_t n_rows_ = 0;
    std::vector<std::unique_ptr<uint8_t[]>> pages_;
    std::vector<uint32_t> slots_;  // row index + 1, 0 = empty; a power of two, at most 3/4 full
};

}  // namespace mnn_h2o
