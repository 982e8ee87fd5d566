#include "mnn_h2o/dense/q4_matrix.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mnn_h2o/cache/fp16.h"
#include "q4_matrix_kernels.h"

namespace mnn_h2o {

namespace {

void q4_rows_scalar(const Q4Rows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    const int nb = x.cols / kQ4Block;
    // The integer dot of block b's nibbles (q) with codes of the pair layout (c at the pair).
    auto dot = [](const uint8_t* q, const int8_t* c, int half) {
        const int8_t* lo = c + half * 16;  // values 0-15 of the block
        const int8_t* hi = lo + 32;        // values 16-31
        int32_t d = 0;
        for (int j = 0; j < 16; ++j) d += (q[j] & 15) * lo[j] + (q[j] >> 4) * hi[j];
        return static_cast<float>(d);
    };
    for (int r = r0; r < r1; ++r) {
        float acc = 0.f;
        for (int b = 0; b < nb; ++b) {
            const int pair = b / 2, half = b % 2;
            const uint8_t* q = p.nibbles + (static_cast<size_t>(r) * p.pairs + pair) * 32 + half * 16;
            const uint16_t* sm = p.scale_mins + (static_cast<size_t>(r) * p.pairs + pair) * 4;
            const size_t bb = static_cast<size_t>(b);
            const float codes = x.scales[bb] * dot(q, x.codes.data() + pair * 64, half) +
                                x.residual_scales[bb] * dot(q, x.residual_codes.data() + pair * 64, half);
            acc += fp16_to_fp32(sm[half]) * codes + fp16_to_fp32(sm[2 + half]) * x.sums[bb];
        }
        p.y[r - r0] = acc;
    }
}

}  // namespace

void Q4Matrix::integer_row(int r, int b0, int b1, uint8_t* u, float* a, float* b) const {
    if (r < 0 || r >= rows_ || b0 < 0 || b1 > cols_ / kQ4Block || b0 > b1)
        throw std::out_of_range("Q4Matrix::integer_row: row or blocks out of range");
    for (int blk = b0; blk < b1; ++blk, u += kQ4Block, a += 2, b += 2) {
        const size_t pair = static_cast<size_t>(r) * pairs_ + static_cast<size_t>(blk / 2);
        const int half = blk % 2;
        const uint8_t* q = nibbles_.data() + pair * 32 + half * 16;
        for (int j = 0; j < 16; ++j) {
            u[j] = q[j] & 15;
            u[j + 16] = q[j] >> 4;
        }
        a[0] = a[1] = fp16_to_fp32(scale_mins_[pair * 4 + half]);
        b[0] = b[1] = fp16_to_fp32(scale_mins_[pair * 4 + 2 + half]);
    }
}

void Q4Matrix::prefetch_row(int r, int b0, int b1) const {
    if (r < 0 || r >= rows_ || b0 < 0 || b1 > cols_ / kQ4Block || b0 >= b1) return;
    const size_t first = static_cast<size_t>(r) * pairs_ + static_cast<size_t>(b0 / 2);
    const size_t last = static_cast<size_t>(r) * pairs_ + static_cast<size_t>((b1 - 1) / 2);
    for (size_t o = first * 32; o < (last + 1) * 32; o += 64) __builtin_prefetch(nibbles_.data() + o);
    for (size_t o = first * 4; o < (last + 1) * 4; o += 32) __builtin_prefetch(scale_mins_.data() + o);
}

void Q8Activation::resize(int n) {
    cols = n;
    const size_t nb = static_cast<size_t>(n / kQ4Block), pairs = pair_form ? (nb + 1) / 2 : 0;
    codes.assign(pairs * 64, 0);
    residual_codes.assign(pairs * 64, 0);
    scales.assign(pair_form ? nb : 0, 0.f);
    residual_scales.assign(pair_form ? nb : 0, 0.f);
    sums.assign(nb, 0.f);
    pair_scales.assign(pairs * 8, 0.f);
    pair_residual_scales.assign(pairs * 8, 0.f);
    pair_sums.assign(pairs * 8, 0.f);
    const size_t kq = kquant_form && n % 256 == 0 ? static_cast<size_t>(n) : 0;  // the k-quant form
    seq_codes.assign(kq, 0);
    super_steps.assign(kq / 256, 0.f);
    multipliers.assign(kq / 32, 1);
    rounding_errors.assign(kq / 32, 0.f);
    rounded_sums16.assign(kq / 16, 0.f);
}

namespace {

// v * inv rounded to nearest, ties to even, as std::nearbyint in the default rounding mode, but
// inline (nearbyint and fmax are libm calls per value, ~1 ms a token here): adding and subtracting
// 1.5 * 2^23 rounds a float below 2^22 in magnitude. |v * inv| <= 127 by the scale's choice; a
// NaN or infinite x would give a NaN scale, and the clamp keeps the conversion defined.
int8_t round_code(float v, float inv) {
    constexpr float kRound = 12582912.f;
    const float r = (v * inv + kRound) - kRound;
    const float c = r >= -127.f ? r : -127.f;
    return static_cast<int8_t>(c > 127.f ? 127.f : c);
}

// Rounds the 32 values v to codes c (pair layout: 0-15 at c, 16-31 at c + 32); returns the scale.
float round_block(const float* v, int8_t* c) {
    float amax = 0.f;
    for (int i = 0; i < kQ4Block; ++i) {
        const float a = std::fabs(v[i]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.f;
    const float inv = d > 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 16; ++i) {
        c[i] = round_code(v[i], inv);
        c[32 + i] = round_code(v[16 + i], inv);
    }
    return d;
}

}  // namespace

namespace {

// One super-block of 256 values v in the k-quant form (q4_matrix.h): codes c, the blocks'
// multipliers; returns the step.
float round_super(const float* v, int8_t* c, int16_t* multiplier) {
    float amax[8], top = 0.f;
    for (int b = 0; b < 8; ++b) {
        float a = 0.f;
        for (int i = 0; i < kQ4Block; ++i) {
            const float f = std::fabs(v[32 * b + i]);
            a = f > a ? f : a;
        }
        amax[b] = a;
        top = a > top ? a : top;
    }
    if (!(top > 0.f)) {  // all zero (or not finite: codes clamp, the product shows it)
        for (int i = 0; i < 256; ++i) c[i] = 0;
        for (int b = 0; b < 8; ++b) multiplier[b] = 1;
        return top > 0.f ? top : 0.f;
    }
    constexpr int kTop = Q8Activation::kMaxMultiplier;
    const float step = top / 127.f / static_cast<float>(kTop);
    for (int b = 0; b < 8; ++b) {
        // ceil of amax * kTop / top, within [1, kTop]; the largest block's may round above kTop,
        // and its codes then clamp at 127 by at most a rounding of a float.
        int m = static_cast<int>(std::ceil(amax[b] / (127.f * step)));
        m = m < 1 ? 1 : (m > kTop ? kTop : m);
        multiplier[b] = static_cast<int16_t>(m);
        const float inv = 1.f / (step * static_cast<float>(m));
        for (int i = 0; i < kQ4Block; ++i) c[32 * b + i] = round_code(v[32 * b + i], inv);
    }
    return step;
}

}  // namespace

void Q8Activation::quantize_blocks(const float* x, int b0, int b1) {
    for (int b = b0; b < b1; ++b) {
        const float* xb = x + static_cast<size_t>(b) * kQ4Block;
        const size_t pair = static_cast<size_t>(b / 2), half = static_cast<size_t>(b % 2);
        const size_t bb = static_cast<size_t>(b);
        float sum = 0.f;
        for (int i = 0; i < kQ4Block; ++i) sum += xb[i];
        sums[bb] = sum;
        if (pair_form) {
            int8_t* c = codes.data() + pair * 64 + half * 16;
            const float d = round_block(xb, c);
            float rest[kQ4Block];
            for (int i = 0; i < kQ4Block; ++i) rest[i] = xb[i] - d * c[i < 16 ? i : 32 + i - 16];
            const float rd = round_block(rest, residual_codes.data() + pair * 64 + half * 16);
            scales[bb] = d;
            residual_scales[bb] = rd;
            for (size_t i = 0; i < 4; ++i) {
                pair_scales[pair * 8 + half * 4 + i] = d;
                pair_residual_scales[pair * 8 + half * 4 + i] = rd;
                pair_sums[pair * 8 + half * 4 + i] = sum * 0.25f;
            }
        }
        // The k-quant form needs its super-block's 8 blocks: written with block 8 k + 7.
        if (!seq_codes.empty() && b % 8 == 7) {
            const size_t k = bb / 8;
            const float* v = x + k * 256;
            int8_t* c = seq_codes.data() + k * 256;
            const float t = round_super(v, c, multipliers.data() + k * 8);
            super_steps[k] = t;
            // The errors summed as differences: the difference of the sums would cancel.
            for (int g = 0; g < 16; ++g) {
                float error = 0.f, rounded = 0.f;
                for (int i = 16 * g; i < 16 * g + 16; ++i) {
                    const float r = t * static_cast<float>(multipliers[k * 8 + static_cast<size_t>(i / 32)]) * c[i];
                    rounded += r;
                    error += v[i] - r;
                }
                rounded_sums16[k * 16 + static_cast<size_t>(g)] = rounded;
                if (g % 2 == 0) rounding_errors[k * 8 + static_cast<size_t>(g / 2)] = 0.f;
                rounding_errors[k * 8 + static_cast<size_t>(g / 2)] += error;
            }
        }
    }
}

void Q8Activation::quantize(const float* x, int n) {
    // Every block is rewritten; only the zero padding of a missing odd block is kept from resize,
    // so the decode layers' per-product calls (same width each time) allocate and clear nothing.
    if (n != cols) resize(n);
    quantize_blocks(x, 0, n / kQ4Block);
}

Q4Matrix::Q4Matrix(int rows, int cols, const std::vector<uint8_t>& nibbles, const std::vector<uint16_t>& scales,
                   const std::vector<uint16_t>& mins)
    : rows_(rows), cols_(cols) {
    if (rows <= 0 || cols <= 0 || cols % kQ4Block != 0)
        throw std::invalid_argument("Q4Matrix: rows and cols must be positive, cols a multiple of 32 (got " +
                                    std::to_string(rows) + " x " + std::to_string(cols) + ")");
    const size_t n = static_cast<size_t>(rows) * cols;
    if (nibbles.size() != n / 2 || scales.size() != n / kQ4Block || mins.size() != n / kQ4Block)
        throw std::invalid_argument("Q4Matrix: " + std::to_string(nibbles.size()) + " nibble bytes, " +
                                    std::to_string(scales.size()) + " scales and " + std::to_string(mins.size()) +
                                    " mins for " + std::to_string(rows) + " x " + std::to_string(cols) + " (need " +
                                    std::to_string(n / 2) + ", " + std::to_string(n / kQ4Block) + " and " +
                                    std::to_string(n / kQ4Block) + ")");
    const int nb = cols / kQ4Block;
    pairs_ = (nb + 1) / 2;
    nibbles_.assign(static_cast<size_t>(rows) * pairs_ * 32, 0);
    scale_mins_.assign(static_cast<size_t>(rows) * pairs_ * 4, 0);  // a missing odd block: scale 0, min 0
    for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nb; ++b) {
            const size_t src = static_cast<size_t>(r) * nb + b;
            const size_t pair = static_cast<size_t>(r) * pairs_ + b / 2;
            std::memcpy(&nibbles_[pair * 32 + (b % 2) * 16], &nibbles[src * 16], 16);
            scale_mins_[pair * 4 + b % 2] = scales[src];
            scale_mins_[pair * 4 + 2 + b % 2] = mins[src];
        }
}

void Q4Matrix::multiply_rows(const Q8Activation& x, int r0, int r1, float* y, Isa isa) const {
    if (r0 < 0 || r1 > rows_ || r0 > r1) throw std::out_of_range("Q4Matrix::multiply_rows: rows out of range");
    const size_t nb = static_cast<size_t>(cols_ / kQ4Block), pairs = static_cast<size_t>(pairs_);
    if (x.cols != cols_ || x.codes.size() != pairs * 64 || x.residual_codes.size() != pairs * 64 ||
        x.pair_scales.size() != pairs * 8 || x.pair_residual_scales.size() != pairs * 8 ||
        x.pair_sums.size() != pairs * 8 || x.scales.size() != nb || x.residual_scales.size() != nb ||
        x.sums.size() != nb)
        throw std::invalid_argument("Q4Matrix::multiply_rows: an activation of " + std::to_string(x.cols) +
                                    " values for a matrix of " + std::to_string(cols_) + " columns");
    const Q4Rows p{nibbles_.data(), scale_mins_.data(), pairs_, &x, y};
    void (*kernel)(const Q4Rows&, int, int) = q4_rows_scalar;
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512 && cpu_features().avx512_vnni)
        kernel = q4_rows_avx512vnni;
    else if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma)
        kernel = q4_rows_avx2;
#elif defined(__aarch64__)
    if (isa == Isa::Neon) kernel = q4_rows_neon;
#else
    (void)isa;
#endif
    kernel(p, r0, r1);
}

}  // namespace mnn_h2o
