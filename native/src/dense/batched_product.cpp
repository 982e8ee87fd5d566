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
    tiles = (rows + kTileRows - 1) / kTileRows;
    const size_t padded = static_cast<size_t>(tiles) * kTileRows;
    codes.resize(padded * width);
    residual_codes.resize(residual ? padded * width : 0);
    steps.resize(padded * (width / 32));
    residual_steps.resize(residual ? padded * (width / 32) : 0);
    sums.resize(padded * (width / kIntegerGroup));
    errors.resize(padded * (width / kIntegerGroup));
    block_sums.resize(padded * (width / 32));
    block_errors.resize(padded * (width / 32));
    // The last tile's padding rows are zeros (the kernels multiply them and store nothing).
    for (int i = rows; i < tiles * kTileRows; ++i) {
        for (int c = 0; c < width; c += 4) {
            std::memset(codes.data() + code_at(i, c), 0, 4);
            if (residual) std::memset(residual_codes.data() + code_at(i, c), 0, 4);
        }
        for (int b = 0; b < width / 32; ++b) {
            const size_t at = value_at(i, b, width / 32);
            steps[at] = block_sums[at] = block_errors[at] = 0.f;
            if (residual) residual_steps[at] = 0.f;
        }
        for (int g = 0; g < width / kIntegerGroup; ++g) sums[value_at(i, g, width / kIntegerGroup)] =
            errors[value_at(i, g, width / kIntegerGroup)] = 0.f;
    }
}

namespace {

// Rounds the 32 values v to codes c; returns the step (amax / 127; 0 for a block of zeros).
float round_block(const float* v, int8_t* c) {
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding and subtracting rounds to nearest, ties to even
    // Eight running maxima, then theirs: lanes the compiler keeps in one vector (a single
    // running maximum is a chain it must not reorder).
    float lanes[8] = {};
    for (int l = 0; l < 32; l += 8)
        for (int k = 0; k < 8; ++k) lanes[k] = std::max(lanes[k], std::fabs(v[l + k]));
    float amax = 0.f;
    for (float m : lanes) amax = std::max(amax, m);
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int l = 0; l < 32; ++l) {
        const float r = (v[l] * inv + kRound) - kRound;
        c[l] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
    }
    return amax / 127.f;
}

// The sum of the 16 bytes at r, each shifted right by `shift` and masked: as two 64-bit words,
// their bytes paired into 16-bit lanes, the lanes summed by one multiply (at most 16 x 255 < 2^16).
int byte_sum16(const uint8_t* r, int shift, uint64_t mask) {
    constexpr uint64_t kEven = 0x00ff00ff00ff00ffull;
    uint64_t w[2];
    std::memcpy(w, r, 16);
    uint64_t pairs = 0;
    for (uint64_t x : w) {
        x = (x >> shift) & mask;
        pairs += (x & kEven) + ((x >> 8) & kEven);
    }
    return static_cast<int>((pairs * 0x0001000100010001ull) >> 48);
}

}  // namespace

void Q8Rows::quantize_rows(const float* x, int ldx, int i0, int i1) {
    const int nb = cols / 32, ng = cols / kIntegerGroup;
    for (int i = i0; i < i1; ++i) {
        const float* row = x + static_cast<size_t>(i) * ldx;
        for (int b = 0; b < nb; ++b) {
            const float* v = row + 32 * b;
            int8_t c[32];
            const float step = round_block(v, c);
            for (int q = 0; q < 8; ++q) std::memcpy(codes.data() + code_at(i, 32 * b + 4 * q), c + 4 * q, 4);
            float left[32];
            for (int l = 0; l < 32; ++l) left[l] = v[l] - step * static_cast<float>(c[l]);
            const size_t blk = value_at(i, b, nb);
            if (residual) {
                int8_t rc[32];
                const float rstep = round_block(left, rc);
                for (int q = 0; q < 8; ++q) std::memcpy(residual_codes.data() + code_at(i, 32 * b + 4 * q), rc + 4 * q, 4);
                residual_steps[blk] = rstep;
                for (int l = 0; l < 32; ++l) left[l] -= rstep * static_cast<float>(rc[l]);
            }
            // The errors summed as differences: the difference of the sums would cancel.
            float sum[2] = {0.f, 0.f}, error[2] = {0.f, 0.f};
            for (int h = 0; h < 2; ++h) {
                for (int l = 16 * h; l < 16 * h + 16; ++l) {
                    sum[h] += v[l];
                    error[h] += left[l];
                }
                const size_t g = value_at(i, 2 * b + h, ng);
                sums[g] = sum[h];
                errors[g] = error[h];
            }
            block_sums[blk] = sum[0] + sum[1];
            block_errors[blk] = error[0] + error[1];
            steps[blk] = step;
        }
    }
}

void panel_tile_scalar(const PanelTile& t) {
    for (int i = 0; i < t.n; ++i) {
        const TileRow x(t, i);
        float* y = t.y + static_cast<size_t>(i) * t.ldy;
        for (int j = 0; j < t.width; ++j) {
            float acc = 0.f;
            for (int g = 0; g < t.kc / t.group; ++g) {
                int32_t dot = 0, rdot = 0;
                for (int l = 0; l < t.group; ++l) {
                    const int col = t.group * g + l;
                    const int32_t u = t.u[(col / 4) * 64 + 4 * j + col % 4];
                    const int c = kCodeStride * (col / 4) + col % 4;
                    dot += u * x.codes[c];
                    if (x.residual_codes) rdot += u * x.residual_codes[c];
                }
                const size_t at = static_cast<size_t>(g * kPanelRows + j);
                const int blk = kValueStride * (g * t.group / 32);
                float dots = x.steps[blk] * static_cast<float>(dot);
                if (x.residual_codes) dots += x.residual_steps[blk] * static_cast<float>(rdot);
                acc += t.a[at] * dots + t.b[at] * x.sums[kValueStride * g] + t.centre[at] * x.errors[kValueStride * g];
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
    constexpr int kGroups = kPanelCols / kIntegerGroup;  // the most a panel has (groups of 16)
    // A panel's u as u & 63 and, where some u is larger (Q8_0's q + 128), u >> 6 as a second panel
    // of 64 times the scales: the kernels' integer dots take u <= 63 (batched_product_kernels.h).
    // Words: four columns of one row, as the kernels' lanes take them.
    alignas(64) uint32_t u[kPanelCols / 4 * kPanelRows], u_high[kPanelCols / 4 * kPanelRows];
    alignas(64) float a[kGroups * kPanelRows], b[kGroups * kPanelRows], centre[kGroups * kPanelRows];
    alignas(64) float a_high[kGroups * kPanelRows], b_high[kGroups * kPanelRows], centre_high[kGroups * kPanelRows];
    std::fill(b_high, b_high + kGroups * kPanelRows, 0.f);
    alignas(64) uint32_t rows_w[kPanelRows][kPanelCols / 4];  // the panel's rows as integer_row gives them
    float rows_a[kPanelRows][kGroups], rows_b[kPanelRows][kGroups];
    const int cols = w.cols();
    for (int p0 = r0; p0 < r1; p0 += kPanelRows) {
        const int width = std::min(kPanelRows, r1 - p0);
        const int group = w.integer_group(p0, p0 + width), per = group / kIntegerGroup;
        for (int c0 = 0; c0 < cols; c0 += kPanelCols) {
            const int kc = std::min(kPanelCols, cols - c0), groups = kc / group;
            uint8_t any = 0;
            for (int j = 0; j < kPanelRows; ++j) {
                uint8_t* row = reinterpret_cast<uint8_t*>(rows_w[j]);
                if (j < width) {
                    w.integer_row(p0 + j, c0, c0 + kc, row, rows_a[j], rows_b[j]);
                    for (int c = 0; c < kc; ++c) any |= row[c];
                } else {
                    std::fill(row, row + kc, uint8_t{0});
                    std::fill(rows_a[j], rows_a[j] + kc / kIntegerGroup, 0.f);
                    std::fill(rows_b[j], rows_b[j] + kc / kIntegerGroup, 0.f);
                }
            }
            const bool wide = any >= 64;
            // The panel: word q of each of its rows side by side (a plain transpose, kept free of
            // the wide case's split so that it stays a loop of word moves).
            if (!wide) {
                for (int q = 0; q < kc / 4; ++q)
                    for (int j = 0; j < kPanelRows; ++j) u[q * kPanelRows + j] = rows_w[j][q];
            } else {
                for (int q = 0; q < kc / 4; ++q)
                    for (int j = 0; j < kPanelRows; ++j) {
                        const uint32_t word = rows_w[j][q];
                        u_high[q * kPanelRows + j] = (word >> 6) & 0x03030303u;
                        u[q * kPanelRows + j] = word & 0x3f3f3f3fu;
                    }
            }
            // The codes' sums per group; the high parts only where there are some.
            const float per_column = 1.f / static_cast<float>(group);  // a power of two: exact
            for (int j = 0; j < kPanelRows; ++j) {
                const uint8_t* row = reinterpret_cast<const uint8_t*>(rows_w[j]);
                for (int g = 0; g < groups; ++g) {
                    int low_sum = 0, high_sum = 0;
                    for (int s = group * g; s < group * (g + 1); s += 16) {
                        low_sum += byte_sum16(row + s, 0, 0x3f3f3f3f3f3f3f3full);
                        if (wide) high_sum += byte_sum16(row + s, 6, 0x0303030303030303ull);
                    }
                    const int at = g * kPanelRows + j;
                    a[at] = rows_a[j][g * per];
                    b[at] = rows_b[j][g * per];
                    centre[at] = a[at] * static_cast<float>(low_sum) * per_column;
                    if (wide) {
                        a_high[at] = 64.f * a[at];
                        centre_high[at] = a_high[at] * static_cast<float>(high_sum) * per_column;
                    }
                }
            }
            // The weights of the next panel slice come from DRAM while this one is multiplied
            // (the decoding of 16 row streams stalled on them: 5% of a 1.5B prompt in one load).
            const int next_c0 = c0 + kPanelCols < cols ? c0 + kPanelCols : 0;
            const int next_p0 = next_c0 > 0 ? p0 : p0 + kPanelRows;
            if (next_p0 < r1)
                for (int j = 0; j < std::min(kPanelRows, r1 - next_p0); ++j)
                    w.prefetch_row(next_p0 + j, next_c0, std::min(cols, next_c0 + kPanelCols));
            // The activation's tiles from this panel's first column on (batched_product_kernels.h).
            const bool by_block = group == 32;
            const int per_row = xq.cols / group;
            const size_t tile_codes = static_cast<size_t>(xq.cols) * Q8Rows::kTileRows;
            const size_t at_block = Q8Rows::value_at(0, c0 / 32, xq.cols / 32), at_group = Q8Rows::value_at(0, c0 / group, per_row);
            PanelTile tile{reinterpret_cast<const uint8_t*>(u), a, b, centre, group, kc,
                           xq.codes.data() + xq.code_at(0, c0), twice ? xq.residual_codes.data() + xq.code_at(0, c0) : nullptr,
                           tile_codes,
                           xq.steps.data() + at_block, twice ? xq.residual_steps.data() + at_block : nullptr,
                           static_cast<size_t>(xq.cols / 32) * Q8Rows::kTileRows,
                           (by_block ? xq.block_sums : xq.sums).data() + at_group,
                           (by_block ? xq.block_errors : xq.errors).data() + at_group,
                           static_cast<size_t>(per_row) * Q8Rows::kTileRows, xq.n, y + p0, ldy, width, c0 > 0};
            kernel(tile);
            if (wide) {
                tile.u = reinterpret_cast<const uint8_t*>(u_high);
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
