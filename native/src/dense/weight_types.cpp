#include "mnn_h2o/dense/weight_types.h"

#include <cstring>
#include <stdexcept>

#include "mnn_h2o/cache/fp16.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {

namespace {

uint16_t u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

float half(const uint8_t* p) { return fp16_to_fp32(u16(p)); }

void dequantize_q4_0(const uint8_t* b, float* out, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 18, out += 32) {
        const float d = half(b);
        for (int i = 0; i < 16; ++i) {
            out[i] = static_cast<float>((b[2 + i] & 15) - 8) * d;
            out[i + 16] = static_cast<float>((b[2 + i] >> 4) - 8) * d;
        }
    }
}

void dequantize_q4_1(const uint8_t* b, float* out, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 20, out += 32) {
        const float d = half(b), m = half(b + 2);
        for (int i = 0; i < 16; ++i) {
            out[i] = static_cast<float>(b[4 + i] & 15) * d + m;
            out[i + 16] = static_cast<float>(b[4 + i] >> 4) * d + m;
        }
    }
}

void dequantize_q5_0(const uint8_t* b, float* out, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 22, out += 32) {
        const float d = half(b);
        int8_t w[32];
        q5_0_values(b, w);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(w[i]) * d;
    }
}

void dequantize_q8_0(const uint8_t* b, float* out, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 34, out += 32) {
        const float d = half(b);
        for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
    }
}

// Q4_K and Q5_K: the same sub-blocks, Q5_K with a fifth bit per value (weight_types.h).
template <bool kFifthBit>
void dequantize_q45_k(const uint8_t* b, float* out, size_t n) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    for (size_t k = 0; k < n; ++k, b += kBytes, out += 256) {
        const float d = half(b), dmin = half(b + 2);
        uint8_t s[8], m[8];
        q4_k_scales_mins(b + 4, s, m);
        for (int j = 0; j < 8; ++j) {
            const float ds = d * static_cast<float>(s[j]), dm = dmin * static_cast<float>(m[j]);
            const uint8_t* q = b + kQs + 32 * (j / 2);
            for (int l = 0; l < 32; ++l) {
                int v = (j % 2) ? (q[l] >> 4) : (q[l] & 15);
                if (kFifthBit) v += 16 * ((b[16 + l] >> j) & 1);
                out[32 * j + l] = ds * static_cast<float>(v) - dm;
            }
        }
    }
}

void dequantize_q6_k(const uint8_t* b, float* out, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 210, out += 256) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = half(b + 208);
        uint8_t q[256];
        q6_k_values(b, q);
        for (int i = 0; i < 256; ++i) out[i] = d * static_cast<float>(sc[i / 16]) * static_cast<float>(q[i] - 32);
    }
}

// The integer forms (weight_types.h): Q4_0's (n - 8) d is n d + (-8 d); Q4_K's sub-block of 32
// is two groups with its d s_j and -dmin m_j; Q6_K's (q - 32) d sc is q (d sc) + (-32 d sc).
void integer_q4_0(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 18, u += 32, a += 2, o += 2) {
        const float d = half(b);
        for (int i = 0; i < 16; ++i) {
            u[i] = b[2 + i] & 15;
            u[i + 16] = b[2 + i] >> 4;
        }
        a[0] = a[1] = d;
        o[0] = o[1] = -8.f * d;
    }
}

void integer_q4_1(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 20, u += 32, a += 2, o += 2) {
        for (int i = 0; i < 16; ++i) {
            u[i] = b[4 + i] & 15;
            u[i + 16] = b[4 + i] >> 4;
        }
        a[0] = a[1] = half(b);
        o[0] = o[1] = half(b + 2);
    }
}

void integer_q5_0(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 22, u += 32, a += 2, o += 2) {
        const float d = half(b);
        int8_t w[32];
        q5_0_values(b, w);
        for (int i = 0; i < 32; ++i) u[i] = static_cast<uint8_t>(w[i] + 16);
        a[0] = a[1] = d;
        o[0] = o[1] = -16.f * d;
    }
}

// Q8_0's signed code q as q + 128 (0..255), its offset -128 d.
void integer_q8_0(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 34, u += 32, a += 2, o += 2) {
        const float d = half(b);
        for (int i = 0; i < 32; ++i) u[i] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + i]) + 128);
        a[0] = a[1] = d;
        o[0] = o[1] = -128.f * d;
    }
}

template <bool kFifthBit>
void integer_q45_k(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    for (size_t k = 0; k < n; ++k, b += kBytes, u += 256, a += 16, o += 16) {
        const float d = half(b), dmin = half(b + 2);
        uint8_t s[8], m[8];
        q4_k_scales_mins(b + 4, s, m);
        for (int j = 0; j < 8; ++j) {
            const uint8_t* q = b + kQs + 32 * (j / 2);
            for (int l = 0; l < 32; ++l) {
                int v = (j % 2) ? (q[l] >> 4) : (q[l] & 15);
                if (kFifthBit) v += 16 * ((b[16 + l] >> j) & 1);
                u[32 * j + l] = static_cast<uint8_t>(v);
            }
            a[2 * j] = a[2 * j + 1] = d * static_cast<float>(s[j]);
            o[2 * j] = o[2 * j + 1] = -(dmin * static_cast<float>(m[j]));
        }
    }
}

void integer_q6_k(const uint8_t* b, uint8_t* u, float* a, float* o, size_t n) {
    for (size_t k = 0; k < n; ++k, b += 210, u += 256, a += 16, o += 16) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = half(b + 208);
        q6_k_values(b, u);
        for (int g = 0; g < 16; ++g) {
            a[g] = d * static_cast<float>(sc[g]);
            o[g] = -32.f * a[g];
        }
    }
}

// Id order. HeldAs: Q4_0 / Q4_1 keep the pair layout their kernels were measured on (q4_matrix.h);
// the others run on the GGUF's own bytes.
constexpr WeightTypeTraits kTable[] = {
    {WeightType::Q4_0, "Q4_0", 32, 18, HeldAs::Q4Pairs, {0, -1}, dequantize_q4_0, integer_q4_0, 32},
    {WeightType::Q4_1, "Q4_1", 32, 20, HeldAs::Q4Pairs, {0, 2}, dequantize_q4_1, integer_q4_1, 32},
    {WeightType::Q5_0, "Q5_0", 32, 22, HeldAs::GgufBlocks, {0, -1}, dequantize_q5_0, integer_q5_0, 32},
    {WeightType::Q8_0, "Q8_0", 32, 34, HeldAs::GgufBlocks, {0, -1}, dequantize_q8_0, integer_q8_0, 32},
    {WeightType::Q4_K, "Q4_K", 256, 144, HeldAs::GgufBlocks, {0, 2}, dequantize_q45_k<false>, integer_q45_k<false>, 32},
    {WeightType::Q5_K, "Q5_K", 256, 176, HeldAs::GgufBlocks, {0, 2}, dequantize_q45_k<true>, integer_q45_k<true>, 32},
    {WeightType::Q6_K, "Q6_K", 256, 210, HeldAs::GgufBlocks, {208, -1}, dequantize_q6_k, integer_q6_k, 16},
};

}  // namespace

const WeightTypeTraits& weight_traits(int ggml_id) {
    for (const WeightTypeTraits& t : kTable)
        if (static_cast<int>(t.type) == ggml_id) return t;
    std::string names;
    for (const WeightTypeTraits& t : kTable) names += std::string(names.empty() ? "" : ", ") + t.name;
    throw std::invalid_argument("weight type id " + std::to_string(ggml_id) + " is not one the core reads (" + names +
                                ")");
}

const WeightTypeTraits& weight_traits(WeightType type) { return weight_traits(static_cast<int>(type)); }

const WeightTypeTraits* find_weight_traits(const std::string& name) {
    for (const WeightTypeTraits& t : kTable)
        if (name == t.name) return &t;
    return nullptr;
}

const WeightTypeTraits* weight_traits_table(size_t* count) {
    *count = sizeof kTable / sizeof kTable[0];
    return kTable;
}

size_t weight_row_bytes(const WeightTypeTraits& t, int cols) {
    if (cols <= 0 || cols % t.block_values != 0)
        throw std::invalid_argument(std::string(t.name) + " rows hold a multiple of " + std::to_string(t.block_values) +
                                    " values, not " + std::to_string(cols));
    return static_cast<size_t>(cols / t.block_values) * static_cast<size_t>(t.block_bytes);
}

}  // namespace mnn_h2o
