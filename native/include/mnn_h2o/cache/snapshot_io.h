// Byte cursors of the cache snapshot (docs/session_format.md "KVCS"): a writer that appends
// little-endian values to a byte vector, and a reader that checks every length against the bytes
// left and throws SnapshotError (an std::invalid_argument) naming what it was reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace mnn_h2o {

class SnapshotError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// Values are stored as their bytes: the core only builds for little-endian targets (x86-64,
// aarch64), so the in-memory bytes are the format's.
static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE-754 binary32/64 expected");

class SnapshotWriter {
public:
    explicit SnapshotWriter(std::vector<uint8_t>* out) : out_(out) {}
    void bytes(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        if (n) out_->insert(out_->end(), b, b + n);
    }
    template <class T>
    void value(T v) { bytes(&v, sizeof v); }
    template <class T>
    void array(const T* p, size_t n) { bytes(p, n * sizeof(T)); }
    void string(const std::string& s) {
        value(static_cast<uint32_t>(s.size()));
        bytes(s.data(), s.size());
    }
    size_t size() const { return out_->size(); }

private:
    std::vector<uint8_t>* out_;
};

class SnapshotReader {
public:
    SnapshotReader(const uint8_t* p, size_t size) : p_(p), size_(size) {}
    size_t pos() const { return pos_; }
    size_t left() const { return size_ - pos_; }
    // n bytes in place (valid while the input is), or SnapshotError if fewer are left.
    const uint8_t* take(size_t n, const char* what) {
        if (left() < n) truncated(what, std::to_string(n) + " bytes");
        const uint8_t* q = p_ + pos_;
        pos_ += n;
        return q;
    }
    template <class T>
    T value(const char* what) {
        T v;
        std::memcpy(&v, take(sizeof v, what), sizeof v);
        return v;
    }
    // n values into out (n checked against the bytes left first, so a huge n never allocates).
    template <class T>
    void array(T* out, size_t n, const char* what) {
        if (n > left() / sizeof(T)) truncated(what, std::to_string(n) + " values of " + std::to_string(sizeof(T)) + " bytes");
        if (n) std::memcpy(out, take(n * sizeof(T), what), n * sizeof(T));
    }
    std::string string(const char* what) {
        const uint32_t n = value<uint32_t>(what);
        const uint8_t* q = take(n, what);
        return std::string(reinterpret_cast<const char*>(q), n);
    }
    // Throws unless cond: a decoded value out of its range.
    void require(bool cond, const std::string& what) const {
        if (!cond) throw SnapshotError("cache snapshot invalid at offset " + std::to_string(pos_) + ": " + what);
    }

private:
    [[noreturn]] void truncated(const char* what, const std::string& need) const {
        throw SnapshotError("cache snapshot truncated: " + std::string(what) + " needs " + need + " at offset " +
                            std::to_string(pos_) + ", " + std::to_string(left()) + " bytes left");
    }
    const uint8_t* p_;
    size_t size_;
    size_t pos_ = 0;
};

}  // namespace mnn_h2o
