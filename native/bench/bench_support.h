// What the speed programs in native/bench share: random weight blocks of a type, random rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mnn_h2o/cache/fp16.h"
#include "mnn_h2o/dense/weight_types.h"

namespace mnn_h2o {

// Random bytes with finite, modest scales where the type keeps its fp16 fields.
inline std::vector<uint8_t> random_blocks(const WeightTypeTraits& t, size_t n_blocks, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<uint8_t> b(n_blocks * static_cast<size_t>(t.block_bytes));
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    for (size_t k = 0; k < n_blocks; ++k)
        for (int off : t.half_offsets)
            if (off >= 0) {
                const uint16_t h = fp32_to_fp16(0.001f + 0.001f * static_cast<float>(byte(rng)) / 255.f);
                std::memcpy(&b[k * t.block_bytes + static_cast<size_t>(off)], &h, 2);
            }
    return b;
}

// Standard-normal-ish values (a sum of uniforms) from a fixed seed: cheap next to what is timed.
inline std::vector<float> random_rows(size_t n, uint64_t seed) {
    std::vector<float> x(n);
    uint64_t s = seed;
    const auto uniform = [&s] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>(s >> 40) / static_cast<float>(1u << 24);
    };
    for (float& v : x) v = (uniform() + uniform() + uniform() + uniform() - 2.f) * 1.7f;
    return x;
}

}  // namespace mnn_h2o
