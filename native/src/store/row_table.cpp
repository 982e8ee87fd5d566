#include "mnn_h2o/store/row_table.h"

#include <cstring>
#include <new>

#include "mnn_h2o/codec/xxhash64.h"

namespace mnn_h2o {

uint64_t RowTable::hash(const uint8_t* row) const { return xxh64(row, row_bytes_); }

void RowTable::rehash(std::vector<uint32_t>& slots) const {
    const size_t mask = slots.size() - 1;
    for (uint32_t i = 0; i < n_rows_; ++i) {
        size_t s = hash(row(i)) & mask;
        while (slots[s]) s = (s + 1) & mask;
        slots[s] = i + 1;
    }
}

uint32_t RowTable::intern(const uint8_t* bytes) {
    const uint64_t h = hash(bytes);
    if (!slots_.empty()) {
        const size_t mask = slots_.size() - 1;
        for (size_t s = h & mask; slots_[s]; s = (s + 1) & mask)
            if (std::memcmp(row(slots_[s] - 1), bytes, row_bytes_) == 0) return slots_[s] - 1;
    }
    if (n_rows_ >= UINT32_MAX - 1) throw std::bad_alloc();
    // Everything that can fail first, so a failure leaves the table as it was.
    std::vector<uint32_t> grown;
    if ((n_rows_ + 1) * 4 > slots_.size() * 3) {
        grown.assign(slots_.empty() ? 64 : slots_.size() * 2, 0);
        rehash(grown);
    }
    if (n_rows_ % kPageRows == 0) {
        pages_.reserve(pages_.size() + 1);
        pages_.push_back(std::make_unique<uint8_t[]>(kPageRows * row_bytes_));
    }
    if (!grown.empty()) slots_.swap(grown);
    const uint32_t index = static_cast<uint32_t>(n_rows_++);
    std::memcpy(pages_[index / kPageRows].get() + static_cast<size_t>(index % kPageRows) * row_bytes_, bytes, row_bytes_);
    const size_t mask = slots_.size() - 1;
    size_t s = h & mask;
    while (slots_[s]) s = (s + 1) & mask;
    slots_[s] = index + 1;
    return index;
}

void RowTable::compact(const std::vector<uint8_t>& live, std::vector<uint32_t>* remap) {
    RowTable kept(row_bytes_);
    remap->assign(n_rows_, UINT32_MAX);
    for (uint32_t i = 0; i < n_rows_; ++i)
        if (live[i]) (*remap)[i] = kept.intern(row(i));
    *this = std::move(kept);
}

void RowTable::clear() {
    n_rows_ = 0;
    pages_.clear();
    pages_.shrink_to_fit();
    slots_.clear();
    slots_.shrink_to_fit();
}

}  // namespace mnn_h2o
