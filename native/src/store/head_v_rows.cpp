#include "mnn_h2o/store/head_v_rows.h"

#include <cstring>
#include <new>

namespace mnn_h2o::store {

std::optional<StoreFallback> HeadVRows::add_refs(Chunk& c, const uint8_t* v) {
    const size_t n = static_cast<size_t>(c.n_blocks) * block_tokens_;
    std::vector<uint32_t> refs;
    try {
        if (faults_.alloc_failure) throw std::bad_alloc();
        if (!table_) table_ = std::make_unique<RowTable>(row_bytes_);
        refs.resize(n);
        for (size_t i = 0; i < n; ++i) refs[i] = table_->intern(v + i * row_bytes_);
        const int width = table_->size() <= 65536 ? 2 : 4;
        std::vector<uint8_t> blob;
        blob.reserve(c.frame_size + n * width);  // exactly: the capacity is what is held
        blob.assign(c.blob.begin(), c.blob.begin() + static_cast<std::ptrdiff_t>(c.frame_size));
        blob.resize(c.frame_size + n * width);
        for (size_t i = 0; i < n; ++i) write_row_ref(blob.data() + c.frame_size + i * width, width, refs[i]);
        c.blob.swap(blob);
        c.ref_width = width;
        c.table = table_.get();
    } catch (const std::bad_alloc&) {
        dropped_refs_ += n;
        return StoreFallback::AllocFailure;
    }
    for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(table_->row(refs[i]), v + i * row_bytes_, row_bytes_) != 0 || faults_.verify_mismatch) {
            dropped_refs_ += n;
            return StoreFallback::VerifyMismatch;
        }
    }
    return std::nullopt;
}

void HeadVRows::compact(const std::vector<std::unique_ptr<Chunk>>& chunks) {
    if (!table_ || dropped_refs_ == 0 || (!chunks.empty() && dropped_refs_ * 2 < table_->size())) return;
    std::vector<uint8_t> live(table_->size(), 0);
    std::vector<uint32_t> remap;
    try {
        for (const auto& c : chunks) {
            const uint8_t* refs = c->blob.data() + c->frame_size;
            for (size_t i = 0, n = static_cast<size_t>(c->n_blocks) * block_tokens_; i < n; ++i)
                live[read_row_ref(refs + i * c->ref_width, c->ref_width)] = 1;
        }
        table_->compact(live, &remap);
    } catch (const std::bad_alloc&) {
        return;  // keeps the unreferenced rows; tried again after the next drop
    }
    for (const auto& c : chunks) {
        uint8_t* refs = c->blob.data() + c->frame_size;
        for (size_t i = 0, n = static_cast<size_t>(c->n_blocks) * block_tokens_; i < n; ++i)
            write_row_ref(refs + i * c->ref_width, c->ref_width, remap[read_row_ref(refs + i * c->ref_width, c->ref_width)]);
    }
    dropped_refs_ = 0;
}

void HeadVRows::clear() {
    table_.reset();
    dropped_refs_ = 0;
}

}  // namespace mnn_h2o::store
