#include "mnn_h2o/cache/kv_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mnn_h2o/cache/fp16.h"

namespace mnn_h2o {

namespace {

struct Traits {
    KvDtype dtype;
    int bits;       // per element, scales not included
    bool quantised; // integer codes + fp16 scale per kKvQuantGroup elements
    bool rotated;
    KvDtype storage;
};

constexpr Traits kTraits[kKvDtypeCount] = {
    {KvDtype::F16, 16, false, false, KvDtype::F16},
    {KvDtype::BF16, 16, false, false, KvDtype::BF16},
    {KvDtype::F32, 32, false, false, KvDtype::F32},
    {KvDtype::Q8, 8, true, false, KvDtype::Q8},
    {KvDtype::Q4, 4, true, false, KvDtype::Q4},
    {KvDtype::Q4R, 4, true, true, KvDtype::Q4},
    {KvDtype::Q8R, 8, true, true, KvDtype::Q8},
};

// traits() and the names index by the enum's value.
constexpr bool rows_in_enum_order() {
    for (int i = 0; i < kKvDtypeCount; ++i)
        if (static_cast<int>(kTraits[i].dtype) != i) return false;
    return true;
}
static_assert(rows_in_enum_order(), "kTraits[i] is KvDtype i");

const Traits& traits(KvDtype dtype) {
    const int i = static_cast<int>(dtype);
    return kTraits[(i >= 0 && i < kKvDtypeCount) ? i : 0];
}

// Largest code of a symmetric b-bit group: 127 for q8, 7 for q4 (-8 is representable but only
// reached by rounding, never by the scale).
float max_code(KvDtype storage) { return storage == KvDtype::Q8 ? 127.f : 7.f; }

// The group's scale, already rounded to the fp16 it is stored as, and the multiplier that maps
// an element to its code. Both directions use the stored scale, so what attention reads is
// exactly code * scale.
uint16_t group_scale(const float* x, float max_code, float* inv) {
    float amax = 0.f;
    for (int i = 0; i < kKvQuantGroup; ++i) {
        const float a = std::fabs(x[i]);
        if (a > amax) amax = a;  // NaN never compares greater: ignored
    }
    // A scale past fp16's range (|x| > 65504 * max_code, or inf) saturates at the largest
    // finite fp16: such elements clamp to the largest code instead of turning into inf or NaN.
    uint16_t bits = fp32_to_fp16(amax / max_code);
    if ((bits & 0x7C00u) == 0x7C00u) bits = 0x7BFFu;
    const float scale = fp16_to_fp32(bits);
    *inv = scale > 0.f ? 1.f / scale : 0.f;
    return bits;
}

// x * inv rounded to nearest, ties to even (std::nearbyint in the default rounding mode), clamped
// to [lo, hi] before the conversion to int (NaN lands on lo, no UB). Written without nearbyint,
// fmin and fmax, which are libm calls per element here (every appended K/V element goes through
// this): adding and subtracting 1.5 * 2^23 leaves a float of magnitude below 2^22 rounded to an
// integer; larger ones (and infinities) are clamped whatever their fraction.
int code_of(float x, float inv, float lo, float hi) {
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23
    const float y = x * inv;
    // Branch-free selects, so the compiler can vectorise the loops over a group.
    const float r = std::fabs(y) < 4194304.f ? (y + kRound) - kRound : y;
    const float c = r >= lo ? r : lo;
    return static_cast<int>(c > hi ? hi : c);
}

void store_scale(uint8_t* p, uint16_t bits) { std::memcpy(p, &bits, sizeof bits); }

float load_scale(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return fp16_to_fp32(bits);
}

}  // namespace

const char* kv_dtype_name(KvDtype dtype) {
    const char* name = enum_name(dtype);
    return name ? name : "?";
}

bool kv_dtype_from_name(const std::string& name, KvDtype* dtype) { return enum_from_name(name, dtype); }

std::string kv_dtype_names() { return enum_names_text<KvDtype>(); }

bool kv_dtype_valid(int value) { return enum_name(static_cast<KvDtype>(value)) != nullptr; }

bool kv_dtype_quantised(KvDtype dtype) { return traits(dtype).quantised; }
bool kv_dtype_rotated(KvDtype dtype) { return traits(dtype).rotated; }
KvDtype kv_storage_dtype(KvDtype dtype) { return traits(dtype).storage; }

size_t kv_row_bytes(KvDtype dtype, int head_dim) {
    const Traits& t = traits(dtype);
    const size_t payload = static_cast<size_t>(head_dim) * t.bits / 8;
    return t.quantised ? payload + static_cast<size_t>(head_dim / kKvQuantGroup) * sizeof(uint16_t) : payload;
}

std::string kv_dtype_shape_error(KvDtype dtype, int head_dim) {
    if (!kv_dtype_valid(static_cast<int>(dtype))) return "unknown dtype " + std::to_string(static_cast<int>(dtype));
    const Traits& t = traits(dtype);
    if (t.quantised && head_dim % kKvQuantGroup != 0)
        return std::string("dtype ") + kv_dtype_name(dtype) + " needs head_dim a multiple of " +
               std::to_string(kKvQuantGroup) + ", got " + std::to_string(head_dim);
    if (t.rotated && (head_dim & (head_dim - 1)) != 0)
        return std::string("dtype ") + kv_dtype_name(dtype) + " needs head_dim a power of two, got " +
               std::to_string(head_dim) + " (the unrotated " + (t.bits == 8 ? "q8" : "q4") +
               " takes any multiple of " + std::to_string(kKvQuantGroup) + ")";
    return "";
}

void kv_rows_from_f32(KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim) {
    const KvDtype st = kv_storage_dtype(dtype);
    const size_t n = n_rows * static_cast<size_t>(head_dim);
    switch (st) {
        case KvDtype::F32: std::memcpy(dst, src, n * sizeof(float)); return;
        case KvDtype::F16:
            for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_fp16(src[i]);
            return;
        case KvDtype::BF16:
            for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_bf16(src[i]);
            return;
        default: break;
    }
    const size_t row_bytes = kv_row_bytes(st, head_dim);
    const size_t codes = static_cast<size_t>(head_dim) * (st == KvDtype::Q8 ? 8 : 4) / 8;
    const float mc = max_code(st);
    for (size_t r = 0; r < n_rows; ++r) {
        const float* x = src + r * head_dim;
        uint8_t* row = static_cast<uint8_t*>(dst) + r * row_bytes;
        for (int g = 0; g < head_dim / kKvQuantGroup; ++g) {
            const float* xg = x + g * kKvQuantGroup;
            float inv;
            store_scale(row + codes + g * sizeof(uint16_t), group_scale(xg, mc, &inv));
            if (st == KvDtype::Q8) {
                int8_t* q = reinterpret_cast<int8_t*>(row) + g * kKvQuantGroup;
                for (int i = 0; i < kKvQuantGroup; ++i) q[i] = static_cast<int8_t>(code_of(xg[i], inv, -127.f, 127.f));
            } else {
                uint8_t* q = row + g * kKvQuantGroup / 2;
                for (int i = 0; i < kKvQuantGroup; i += 2) {
                    const int lo = code_of(xg[i], inv, -8.f, 7.f) + 8, hi = code_of(xg[i + 1], inv, -8.f, 7.f) + 8;
                    q[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
                }
            }
        }
    }
}

void kv_rows_to_f32(KvDtype dtype, const void* src, float* dst, size_t n_rows, int head_dim) {
    const KvDtype st = kv_storage_dtype(dtype);
    const size_t n = n_rows * static_cast<size_t>(head_dim);
    switch (st) {
        case KvDtype::F32: std::memcpy(dst, src, n * sizeof(float)); return;
        case KvDtype::F16:
            for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(static_cast<const uint16_t*>(src)[i]);
            return;
        case KvDtype::BF16:
            for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(static_cast<const uint16_t*>(src)[i]);
            return;
        default: break;
    }
    const size_t row_bytes = kv_row_bytes(st, head_dim);
    const size_t codes = static_cast<size_t>(head_dim) * (st == KvDtype::Q8 ? 8 : 4) / 8;
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = static_cast<const uint8_t*>(src) + r * row_bytes;
        float* x = dst + r * head_dim;
        // The scale once per group: a software fp16 conversion per element cost more than all the
        // rest (a layer's keys for the query peaks went at ~35 instructions an element).
        for (int g = 0; g < head_dim; g += kKvQuantGroup) {
            const float scale = load_scale(row + codes + (g / kKvQuantGroup) * sizeof(uint16_t));
            for (int d = g; d < std::min(g + kKvQuantGroup, head_dim); ++d) {
                const int q = st == KvDtype::Q8 ? static_cast<int8_t>(row[d])
                                                : ((row[d / 2] >> ((d & 1) * 4)) & 0xF) - 8;
                x[d] = static_cast<float>(q) * scale;
            }
        }
    }
}

void kv_rows_as_stored(KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim) {
    if (!kv_dtype_rotated(dtype)) {
        kv_rows_from_f32(dtype, src, dst, n_rows, head_dim);
        return;
    }
    std::vector<float> rotated(src, src + n_rows * static_cast<size_t>(head_dim));
    hadamard_rows(rotated.data(), n_rows, head_dim);
    kv_rows_from_f32(dtype, rotated.data(), dst, n_rows, head_dim);
}

float hadamard_scale(int n) { return 1.f / std::sqrt(static_cast<float>(n)); }

void hadamard_rows(float* rows, size_t n_rows, int n) {
    const float norm = hadamard_scale(n);
    for (size_t r = 0; r < n_rows; ++r) {
        float* x = rows + r * n;
        for (int len = 1; len < n; len <<= 1)
            for (int i = 0; i < n; i += 2 * len)
                for (int j = i; j < i + len; ++j) {
                    const float a = x[j], b = x[j + len];
                    x[j] = a + b;
                    x[j + len] = a - b;
                }
        for (int i = 0; i < n; ++i) x[i] *= norm;
    }
}

}  // namespace mnn_h2o
