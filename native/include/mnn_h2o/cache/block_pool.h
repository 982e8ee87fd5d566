// Fixed-size memory blocks for the KV cache, carved from mmap'ed slabs.
//
// Why not malloc: the cache must give memory back to the OS as soon as tokens are evicted, so
// that RSS (what a phone's low-memory killer looks at) really drops. A released block's whole
// pages are returned with madvise(MADV_DONTNEED); a slab whose blocks are all free is unmapped.
// Pages of a block are only faulted in when first written.
//
// Placement is for lists of blocks that grow and shrink at their tail (the K or V of one head):
// a list's next block goes right behind its previous one, so each list owns its slabs and is
// contiguous in memory. A freed block is reused when its list grows again; blocks are never
// handed to another list, so mapped address space stays bounded by the lists' peak sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mnn_h2o {

class BlockPool {
public:
    // block_bytes is rounded up to a multiple of 64 (cache-line aligned blocks). A slab holds
    // blocks_per_slab blocks; 0 picks about 512 KiB per slab (at least one block).
    explicit BlockPool(size_t block_bytes, size_t blocks_per_slab = 0);
    ~BlockPool();
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    // A block of block_bytes(), 64-byte aligned, contents unspecified (zero on first use): the
    // block right behind `after` (a block of this pool in use) if that one is free; without
    // `after`, or when that spot is taken or past the slab's end, the first block of a newly
    // mapped slab. Lists of blocks that grow at their tail (a KV head) thus lie contiguously in
    // memory and are read like one array: scattered 8 KiB blocks streamed at about half the
    // bandwidth here, since hardware prefetchers start cold at every page. Throws
    // std::bad_alloc when no slab can be mapped, std::invalid_argument for a bad `after`.
    void* allocate(const void* after = nullptr);
    // Returns a block obtained from allocate() of this pool; nullptr is ignored. Throws
    // std::invalid_argument for a pointer this pool did not hand out (or already got back).
    void release(void* block);

    size_t block_bytes() const { return block_bytes_; }
    size_t blocks_per_slab() const { return blocks_per_slab_; }
    // Bytes of the blocks currently handed out (blocks_in_use * block_bytes), exactly.
    size_t bytes_held() const;
    // Address space currently mapped for slabs (>= bytes_held; resident memory is between the
    // two, since free blocks have had their pages dropped).
    size_t bytes_mapped() const;

private:
    struct Slab {
        uint8_t* base = nullptr;
        size_t map_bytes = 0;
        std::vector<bool> in_use;
        size_t n_used = 0;
    };
    using SlabMap = std::map<uintptr_t, std::unique_ptr<Slab>>;

    Slab& map_slab();
    // The slab holding block (and the block's index), or end() if block is not one of ours.
    SlabMap::iterator find(const void* block, size_t* index);
    void drop_pages(const Slab& slab, size_t index) const;

    // Serialises allocate/release. They run once per block (every block_tokens tokens), never
    // per token, so the lock is off the hot path and makes a pool safe to share.
    mutable std::mutex mutex_;
    const size_t block_bytes_;
    const size_t blocks_per_slab_;
    const size_t page_bytes_;
    SlabMap slabs_;  // by base address, to find a block's slab
    size_t blocks_in_use_ = 0;
    size_t bytes_mapped_ = 0;
};

}  // namespace mnn_h2o
