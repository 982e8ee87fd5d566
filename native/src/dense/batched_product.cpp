#include "mnn_h2o/dense/batched_product.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "batched_product_kernels.h"

namespace mnn_h2o {

void Q8Rows::resize(int rows, int width) {
    if (rows < 0 || width <= 0 || width % 32 != 0)
        throw std::invalid_argument("Q8Rows: " + std::to_string(rows) + " rows of " + std::to_string(width) +
                                    " values (a positive multiple of 32)");
    n = rows;
    cols = width;
    codes.resize(static_cast<size_t>(rows) * width);
    residual_codes.resize(residual ? static_cast<size_t>(rows) * width : 0);
    steps.resize(static_cast<size_t>(rows) * (width / 32));
    residual_steps.resize(residual ? static_cast<size_t>(rows) * (width / 32) : 0);
    sums.resize(static_cast<size_t>(rows) * (width / kIntegerGroup));
    errors.resize(static_cast<size_t>(rows) * (width / kIntegerGroup));
}

namespace {

// Rounds the 32 values v to codes c; returns the step (amax / 127; 0 for a block of zeros).
float round_block(const float* v, int8_t* c) {
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding and subtracting rounds to nearest, ties to even
    float amax = 0.f;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(v[l]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int l = 0; l < 32; ++l) {
        const float r = (v[l] * inv + kRound) - kRound;
        c[l] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
    }
    return amax / 127.f;
}

}  // namespace

void Q8Rows::quantize_rows(const float* x, int ldx, int i0, int i1) {
    const int nb = cols / 32;
    for (int i = i0; i < i1; ++i) {
        const float* row = x + static_cast<size_t>(i) * ldx;
        const size_t at = static_cast<size_t>(i) * cols;
        for (int b = 0; b < nb; ++b) {
            const float* v = row + 32 * b;
            int8_t* c = codes.data() + at + 32 * b;
            const float step = round_block(v, c);
            float left[32];
            for (int l = 0; l < 32; ++l) left[l] = v[l] - step * static_cast<float>(c[l]);
            if (residual) {
                int8_t* rc = residual_codes.data() + at + 32 * b;
                const float rstep = round_block(left, rc);
                residual_steps[static_cast<size_t>(i) * nb + b] = rstep;
                for (int l = 0; l < 32; ++l) left[l] -= rstep * static_cast<float>(rc[l]);
            }
            // The errors summed as differences: the difference of the sums would cancel.
            for (int h = 0; h < 2; ++h) {
                float sum = 0.f, error = 0.f;
                for (int l = 16 * h; l < 16 * h + 16; ++l) {
                    sum += v[l];
                    error += left[l];
                }
                const size_t g = static_cast<size_t>(i) * (cols / kIntegerGroup) + 2 * b + h;
                sums[g] = sum;
                errors[g] = error;
            }
            steps[static_cast<size_t>(i) * nb + b] = step;
        }
    }
}

void panel_tile_scalar(const PanelTile& t) {
    for (int i = 0; i < t.n; ++i) {
        const TileRow x(t, i);
        float* y = t.y + static_cast<size_t>(i) * t.ldy;
        for (int j = 0; j < t.width; ++j) {
            float acc = 0.f;
            for (int g = 0; g < t.kc / kIntegerGroup; ++g) {
                int32_t dot = 0, rdot = 0;
                for (int l = 0; l < kIntegerGroup; ++l) {
                    const int col = kIntegerGroup * g + l;
                    const int32_t u = t.u[(col / 4) * 64 + 4 * j + col % 4];
                    dot += u * x.codes[col];
                    if (x.residual_codes) rdot += u * x.residual_codes[col];
                }
                const size_t at = static_cast<size_t>(g * kPanelRows + j);
                float dots = x.steps[g / 2] * static_cast<float>(dot);
                if (x.residual_codes) dots += x.residual_steps[g / 2] * static_cast<float>(rdot);
                acc += t.a[at] * dots + t.b[at] * x.sums[g] + t.centre[at] * x.errors[g];
            }
            y[j] = t.accumulate ? y[j] + acc : acc;
        }
    }
}

namespace {

PanelKernel panel_kernel(Isa isa) {
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512 && cpu_features().avx512_vnni) return panel_tile_avx512vnni;
    if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma) return panel_tile_avx2;
#elif defined(__aarch64__)
    if (isa == Isa::Neon) return panel_tile_neon;
#endif
    (void)isa;
    return panel_tile_scalar;
}

}  // namespace

void multiply_batch(const WeightMatrix& w, const Q8Rows& xq, int r0, int r1, float* y, int ldy, Isa isa) {
    if (r0 < 0 || r1 > w.rows() || r0 > r1) throw std::out_of_range("multiply_batch: rows out of range");
    if (xq.cols != w.cols() || ldy < r1)
        throw std::invalid_argument("multiply_batch: an activation of " + std::to_string(xq.cols) +
                                    " values for a matrix of " + std::to_string(w.cols()) + " columns, ldy " +
                                    std::to_string(ldy) + " (rows to " + std::to_string(r1) + ")");
    if (w.reads_twice_rounded() && xq.residual_codes.empty())
        throw std::invalid_argument("multiply_batch: " + w.type_names() + " rows need the activation rounded twice");
    if (xq.n == 0 || r0 == r1) return;
    // Both roundings where the activation has them (Q4_0 / Q4_1 rows need them, as their pair
    // form does: q4_matrix.h); its errors are what all of its roundings left.
    const bool twice = !xq.residual_codes.empty();
    const PanelKernel kernel = panel_kernel(isa);
    constexpr int kGroups = kPanelCols / kIntegerGroup;
    // A panel's u as u & 63 and, where some u is larger (Q8_0's q + 128), u >> 6 as a second panel
    // of 64 times the scales: the kernels' integer dots take u <= 63 (batched_product_kernels.h).
    alignas(64) uint8_t u[kPanelCols * kPanelRows], u_high[kPanelCols * kPanelRows];
    alignas(64) float a[kGroups * kPanelRows], b[kGroups * kPanelRows], centre[kGroups * kPanelRows];
    alignas(64) float a_high[kGroups * kPanelRows], b_high[kGroups * kPanelRows], centre_high[kGroups * kPanelRows];
    std::fill(b_high, b_high + kGroups * kPanelRows, 0.f);
    alignas(64) uint8_t row_u[kPanelCols];
    float row_a[kGroups], row_b[kGroups];
    const int cols = w.cols();
    for (int p0 = r0; p0 < r1; p0 += kPanelRows) {
        const int width = std::min(kPanelRows, r1 - p0);
        for (int c0 = 0; c0 < cols; c0 += kPanelCols) {
            const int kc = std::min(kPanelCols, cols - c0);
            bool wide = false;
            for (int j = 0; j < kPanelRows; ++j) {
                if (j < width) {
                    w.integer_row(p0 + j, c0, c0 + kc, row_u, row_a, row_b);
                } else {
                    std::fill(row_u, row_u + kc, uint8_t{0});
                    std::fill(row_a, row_a + kc / kIntegerGroup, 0.f);
                    std::fill(row_b, row_b + kc / kIntegerGroup, 0.f);
                }
                // Four columns of a row are one 32-bit lane of the panel: copied as words.
                for (int q = 0; q < kc / 4; ++q) {
                    uint32_t word, high;
                    std::memcpy(&word, row_u + 4 * q, 4);
                    high = (word >> 6) & 0x03030303u;
                    wide |= high != 0;
                    word &= 0x3f3f3f3fu;
                    std::memcpy(u + q * 64 + 4 * j, &word, 4);
                    std::memcpy(u_high + q * 64 + 4 * j, &high, 4);
                }
                for (int g = 0; g < kc / kIntegerGroup; ++g) {
                    int low_sum = 0, high_sum = 0;
                    for (int l = 0; l < kIntegerGroup; ++l) {
                        low_sum += row_u[kIntegerGroup * g + l] & 63;
                        high_sum += row_u[kIntegerGroup * g + l] >> 6;
                    }
                    const int at = g * kPanelRows + j;
                    a[at] = row_a[g];
                    b[at] = row_b[g];
                    centre[at] = row_a[g] * static_cast<float>(low_sum) / kIntegerGroup;
                    a_high[at] = 64.f * row_a[g];
                    centre_high[at] = a_high[at] * static_cast<float>(high_sum) / kIntegerGroup;
                }
            }
            PanelTile tile{u, a, b, centre, kc, xq.codes.data() + c0, twice ? xq.residual_codes.data() + c0 : nullptr,
                           xq.cols, xq.steps.data() + c0 / 32, twice ? xq.residual_steps.data() + c0 / 32 : nullptr,
                           xq.cols / 32,
                           xq.sums.data() + c0 / kIntegerGroup, xq.errors.data() + c0 / kIntegerGroup,
                           xq.cols / kIntegerGroup, xq.n, y + p0, ldy, width, c0 > 0};
            kernel(tile);
            if (wide) {
                tile.u = u_high;
                tile.a = a_high;
                tile.b = b_high;
                tile.centre = centre_high;
                tile.accumulate = true;
                kernel(tile);
            }
        }
    }
}

}  // namespace mnn_h2o
