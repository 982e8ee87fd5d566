// Read-only bytes on memory the kernel may back with 2 MiB pages (madvise MADV_HUGEPAGE; Linux
// with transparent huge pages in "madvise" or "always" mode): the decode layers' weights, which
// every decode token streams from DRAM. On 4 KiB pages each page costs a TLB walk and the
// hardware prefetchers stop at its end: a two-thread read of 1 GiB measured 28.7 GB/s on 4 KiB
// pages and 33.8 on 2 MiB ones (AMD Zen 4 VM). Where the kernel gives no huge pages the bytes are
// plain pages, and nothing else changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace mnn_h2o {

class HugePageBytes {
public:
    HugePageBytes() = default;
    // A copy of size bytes at src (size may be 0). Throws std::bad_alloc if memory runs out.
    HugePageBytes(const uint8_t* src, size_t size);
    // size bytes written by fill(dst) (a file read straight into them: never held twice) before
    // they turn read-only; what fill throws is passed on, the memory released.
    HugePageBytes(size_t size, const std::function<void(uint8_t* dst)>& fill);
    ~HugePageBytes();
    HugePageBytes(HugePageBytes&& other) noexcept;
    HugePageBytes& operator=(HugePageBytes&& other) noexcept;
    HugePageBytes(const HugePageBytes&) = delete;
    HugePageBytes& operator=(const HugePageBytes&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

private:
    void release();
    uint8_t* data_ = nullptr;  // the mapping's start (2 MiB aligned where size_ reaches 2 MiB)
    size_t size_ = 0;
    size_t map_bytes_ = 0;     // size_ rounded up to whole pages
};

}  // namespace mnn_h2o
