#include "mnn_h2o/cache/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <stdexcept>

namespace mnn_h2o {

namespace {

constexpr size_t kTargetSlabBytes = 512 * 1024;
constexpr size_t kBlockAlign = 64;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

size_t checked_block_bytes(size_t block_bytes) {
    if (block_bytes == 0 || block_bytes > (size_t{1} << 40))
        throw std::invalid_argument("BlockPool: block_bytes must be in [1, 2^40]");
    return round_up(block_bytes, kBlockAlign);
}

}  // namespace

BlockPool::BlockPool(size_t block_bytes, size_t blocks_per_slab)
    : block_bytes_(checked_block_bytes(block_bytes)),
      blocks_per_slab_(blocks_per_slab ? blocks_per_slab
                                       : (block_bytes_ >= kTargetSlabBytes ? 1 : kTargetSlabBytes / block_bytes_)),
      page_bytes_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    if (blocks_per_slab_ > UINT32_MAX || block_bytes_ > SIZE_MAX / blocks_per_slab_ - page_bytes_)
        throw std::invalid_argument("BlockPool: slab size overflows");
}

BlockPool::~BlockPool() {
    for (auto& entry : slabs_) munmap(entry.second->base, entry.second->map_bytes);
}

BlockPool::Slab& BlockPool::map_slab() {
    const size_t bytes = round_up(block_bytes_ * blocks_per_slab_, page_bytes_);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    auto slab = std::make_unique<Slab>();
    slab->base = static_cast<uint8_t*>(p);
    slab->map_bytes = bytes;
    slab->in_use.assign(blocks_per_slab_, false);
    Slab& ref = *slab;
    try {
        slabs_.emplace(reinterpret_cast<uintptr_t>(p), std::move(slab));
    } catch (...) {
        munmap(p, bytes);
        throw;
    }
    bytes_mapped_ += bytes;
    return ref;
}

BlockPool::SlabMap::iterator BlockPool::find(const void* block, size_t* index) {
    const auto addr = reinterpret_cast<uintptr_t>(block);
    auto it = slabs_.upper_bound(addr);
    if (it == slabs_.begin()) return slabs_.end();
    --it;
    const size_t offset = addr - it->first;
    *index = offset / block_bytes_;
    if (offset % block_bytes_ != 0 || *index >= blocks_per_slab_ || !it->second->in_use[*index]) return slabs_.end();
    return it;
}

void* BlockPool::allocate(const void* after) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t index = 0;
    Slab* slab = nullptr;
    if (after) {
        auto it = find(after, &index);
        if (it == slabs_.end()) throw std::invalid_argument("BlockPool::allocate: `after` is not a block in use");
        if (++index < blocks_per_slab_ && !it->second->in_use[index]) slab = it->second.get();
    }
    if (!slab) {
        slab = &map_slab();
        index = 0;
    }
    slab->in_use[index] = true;
    ++slab->n_used;
    ++blocks_in_use_;
    return slab->base + index * block_bytes_;
}

// Returns to the OS every page that lies only under free blocks, starting from block `index`.
// A page shared with a neighbouring block in use keeps its contents.
void BlockPool::drop_pages(const Slab& slab, size_t index) const {
    const size_t begin = index * block_bytes_, end = begin + block_bytes_;
    size_t lo = begin / page_bytes_ * page_bytes_;
    size_t hi = round_up(end, page_bytes_);
    const auto page_is_free = [&](size_t page_start) {
        const size_t first = page_start / block_bytes_;
        const size_t last = (page_start + page_bytes_ - 1) / block_bytes_;
        for (size_t b = first; b <= last && b < blocks_per_slab_; ++b)
            if (slab.in_use[b]) return false;
        return true;
    };
    if (lo < begin && !page_is_free(lo)) lo += page_bytes_;
    if (hi > end && hi - page_bytes_ >= lo && !page_is_free(hi - page_bytes_)) hi -= page_bytes_;
    if (lo < hi) madvise(slab.base + lo, hi - lo, MADV_DONTNEED);
}

void BlockPool::release(void* block) {
    if (!block) return;
    std::lock_guard<std::mutex> lock(mutex_);
    size_t index = 0;
    auto it = find(block, &index);
    if (it == slabs_.end())
        throw std::invalid_argument("BlockPool::release: block not from this pool or already released");
    Slab& slab = *it->second;
    slab.in_use[index] = false;
    --slab.n_used;
    --blocks_in_use_;
    if (slab.n_used == 0) {
        munmap(slab.base, slab.map_bytes);
        bytes_mapped_ -= slab.map_bytes;
        slabs_.erase(it);
        return;
    }
    drop_pages(slab, index);
}

size_t BlockPool::bytes_held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_in_use_ * block_bytes_;
}

size_t BlockPool::bytes_mapped() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_mapped_;
}

}  // namespace mnn_h2o
