#include "mnn_h2o/codec/xxhash64.h"

#include <cstring>

namespace mnn_h2o {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t P3 = 0x165667B19E3779F9ull;
constexpr uint64_t P4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Unaligned little-endian loads (the codec only builds for little-endian hosts).
inline uint64_t load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

inline uint32_t load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline uint64_t round(uint64_t acc, uint64_t lane) { return rotl(acc + lane * P2, 31) * P1; }

inline uint64_t merge(uint64_t acc, uint64_t lane) { return (acc ^ round(0, lane)) * P1 + P4; }

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    const uint8_t* const end = p + size;
    uint64_t acc;
    if (size >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; end - p >= 32; p += 32) {
            v1 = round(v1, load64(p));
            v2 = round(v2, load64(p + 8));
            v3 = round(v3, load64(p + 16));
            v4 = round(v4, load64(p + 24));
        }
        acc = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        acc = merge(merge(merge(merge(acc, v1), v2), v3), v4);
    } else {
        acc = seed + P5;
    }
    acc += static_cast<uint64_t>(size);
    for (; end - p >= 8; p += 8) acc = rotl(acc ^ round(0, load64(p)), 27) * P1 + P4;
    if (end - p >= 4) {
        acc = rotl(acc ^ (static_cast<uint64_t>(load32(p)) * P1), 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; ++p) acc = rotl(acc ^ (*p * P5), 11) * P1;
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

}  // namespace mnn_h2o
