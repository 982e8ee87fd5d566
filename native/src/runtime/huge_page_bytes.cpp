#include "mnn_h2o/runtime/huge_page_bytes.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

namespace mnn_h2o {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

HugePageBytes::HugePageBytes(const uint8_t* src, size_t size)
    : HugePageBytes(size, [src, size](uint8_t* dst) { std::memcpy(dst, src, size); }) {}

HugePageBytes::HugePageBytes(size_t size, const std::function<void(uint8_t* dst)>& fill) {
    if (size == 0) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = round_up(size, page);
    // Below one huge page there is nothing to align; above, map a huge page more and keep the
    // aligned part, so that every whole 2 MiB of the bytes can be one page.
    const size_t extra = size >= kHugePage ? kHugePage : 0;
    if (bytes > SIZE_MAX - extra) throw std::bad_alloc();
    void* p = mmap(nullptr, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    uint8_t* base = static_cast<uint8_t*>(p);
    uint8_t* start = base;
    if (extra) {
        start = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(base), kHugePage));
        if (start > base) munmap(base, static_cast<size_t>(start - base));
        const size_t tail = static_cast<size_t>(base + bytes + extra - (start + bytes));
        if (tail) munmap(start + bytes, tail);
#if defined(MADV_HUGEPAGE)
        madvise(start, bytes, MADV_HUGEPAGE);  // advice: a kernel without THP ignores or refuses it
#endif
    }
    try {
        fill(start);
    } catch (...) {
        munmap(start, bytes);
        throw;
    }
    mprotect(start, bytes, PROT_READ);  // weights are never written: a stray write faults
    data_ = start;
    size_ = size;
    map_bytes_ = bytes;
}

HugePageBytes::~HugePageBytes() { release(); }

HugePageBytes::HugePageBytes(HugePageBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      map_bytes_(std::exchange(other.map_bytes_, 0)) {}

HugePageBytes& HugePageBytes::operator=(HugePageBytes&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        map_bytes_ = std::exchange(other.map_bytes_, 0);
    }
    return *this;
}

void HugePageBytes::release() {
    if (data_) munmap(data_, map_bytes_);
    data_ = nullptr;
    size_ = map_bytes_ = 0;
}

}  // namespace mnn_h2o
