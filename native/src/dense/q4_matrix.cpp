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
    for (int r = r0; r < r1; ++r) {
        float acc = 0.f;
        for (int b = 0; b < nb; ++b) {
            const int pair = b / 2, half = b % 2;
            const uint8_t* q = p.nibbles + (static_cast<size_t>(r) * p.pairs + pair) * 32 + half * 16;
            const int8_t* lo = x.codes.data() + pair * 64 + half * 16;  // values 0-15 of block b
            const int8_t* hi = lo + 32;                                 // values 16-31
            int32_t dot = 0;
            for (int j = 0; j < 16; ++j) dot += (q[j] & 15) * lo[j] + (q[j] >> 4) * hi[j];
            const uint16_t* sm = p.scale_mins + (static_cast<size_t>(r) * p.pairs + pair) * 4;
            acc += fp16_to_fp32(sm[half]) * x.scales[static_cast<size_t>(b)] * static_cast<float>(dot) +
                   fp16_to_fp32(sm[2 + half]) * x.sums[static_cast<size_t>(b)];
        }
        p.y[r - r0] = acc;
    }
}

}  // namespace

void Q8Activation::resize(int n) {
    cols = n;
    const int nb = n / kQ4Block, pairs = (nb + 1) / 2;
    codes.assign(static_cast<size_t>(pairs) * 64, 0);
    scales.assign(static_cast<size_t>(nb), 0.f);
    sums.assign(static_cast<size_t>(nb), 0.f);
    pair_scales.assign(static_cast<size_t>(pairs) * 8, 0.f);
    pair_sums.assign(static_cast<size_t>(pairs) * 8, 0.f);
}

void Q8Activation::quantize_blocks(const float* x, int b0, int b1) {
    for (int b = b0; b < b1; ++b) {
        const float* xb = x + static_cast<size_t>(b) * kQ4Block;
        float amax = 0.f, sum = 0.f;
        for (int i = 0; i < kQ4Block; ++i) {
            amax = std::fmax(amax, std::fabs(xb[i]));
            sum += xb[i];
        }
        const float d = amax / 127.f;
        const float inv = d > 0.f ? 1.f / d : 0.f;
        const int pair = b / 2, half = b % 2;
        int8_t* lo = codes.data() + pair * 64 + half * 16;
        for (int i = 0; i < 16; ++i) {
            lo[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
            lo[32 + i] = static_cast<int8_t>(std::nearbyint(xb[16 + i] * inv));
        }
        scales[static_cast<size_t>(b)] = d;
        sums[static_cast<size_t>(b)] = sum;
        for (int i = 0; i < 4; ++i) {
            pair_scales[static_cast<size_t>(pair) * 8 + half * 4 + i] = d;
            pair_sums[static_cast<size_t>(pair) * 8 + half * 4 + i] = sum * 0.25f;
        }
    }
}

void Q8Activation::quantize(const float* x, int n) {
    resize(n);
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
    if (x.cols != cols_ || x.codes.size() != static_cast<size_t>(pairs_) * 64 ||
        x.pair_scales.size() != static_cast<size_t>(pairs_) * 8 || x.pair_sums.size() != x.pair_scales.size() ||
        x.scales.size() != static_cast<size_t>(cols_ / kQ4Block) || x.sums.size() != x.scales.size())
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
