// A matrix of GGUF weight blocks times many activation rows at once: a prompt chunk's products in
// the decode layers (dense/decode_layers.h), Y = X W^T.
//
// Why not the one-row kernels n times: they unpack every block's integers again for each row, and
// round each activation row anew. Here the activation rows are rounded to int8 once for every
// product that reads them (Q8Rows), and a panel of kPanelRows weight rows is unpacked once per kPanelCols
// columns into the weight types' integer form (weight_types.h: value = u a + b per group of 32
// columns, 16 where a Q6_K row is in the panel; u <= 63; Q8_0's u = q + 128 is split as 64 (u >> 6)
// + (u & 63), two panels), shared by every activation row: per group, the integer dot of u with
// the codes, then
//   y += a * step * dot(u, codes) + b * sum + a * mean(u) * error
// with the activation block's step, the group's float sum of the unrounded values (so a type's
// offsets and mins, Q4_K's dmin m_j, Q6_K's -32, meet exact sums) and the group's rounding error
// (the sum of the values less that of the rounded ones): u is unsigned, so the errors e meet it as
// sum u e, whose part at u's mean is known exactly; only sum (u - mean(u)) e is left of
// the rounding). The floats are met once per group: groups of 32 where the types allow them
// halve that work against 16, which on the 1.5B's Q4_K rows was as much as the integer dots'.
// On x86 the dots are AVX-512 VNNI (64 multiply-adds an instruction) or AVX2
// maddubs; below kMinRows rows the unpacking is not paid back and the callers use the one-row
// kernels.
//
// Summation order: per output, the column panels in order, within a panel the groups in order,
// the integer dots exact: every ISA's float sums in the same order, and any split of the rows
// over threads gives the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/runtime/cpu_features.h"

namespace mnn_h2o {

constexpr int kPanelRows = 16;
constexpr int kPanelCols = 256;
constexpr int kMinRows = 16;

// n activation rows of cols values (cols a multiple of 32) rounded per block of 32: value c of row
// i ~ step(i, c / 32) code(i, c) (+ the residual's where residual: the remainder rounded again)
// (round to nearest, |code| <= 127, step = amax / 127 of what is rounded), sum(i, c / 16) the
// float sum of the group's unrounded values, error what the roundings left of it (summed as
// differences), block_sum / block_error the same per block of 32 (the two groups' added). k-quant
// rows read the codes alone, Q4_0 / Q4_1 rows (as their pair form, q4_matrix.h) both: on
// SmolLM2's Q4_1 prompts one centred rounding cost KL 0.0015 to the exact model (MNN's int8
// modules 0.0006, two roundings 5e-7), on the 1.5B's k-quant prompts 0.0007 (two: 4e-6) for 1.4x
// the prefill speed (docs/notebook/kquant_one_rounding.md).
//
// Held tile by tile as the kernels read them: rows in tiles of kTileRows (the last one padded with
// zero rows), a tile's rows side by side (four codes of each row, then the next four columns; one
// float of each row, then the next block or group), so a kernel reaches a tile's rows from one
// pointer at constant offsets.
struct Q8Rows {
    static constexpr int kTileRows = 8;
    bool residual = true;  // whether resize makes (and quantize_rows writes) the residual codes
    int n = 0, cols = 0, tiles = 0;
    std::vector<int8_t> codes, residual_codes;    // [tiles][cols / 4][kTileRows][4]
    std::vector<float> steps, residual_steps;     // [tiles][cols / 32][kTileRows]
    std::vector<float> sums, errors;              // [tiles][cols / 16][kTileRows]
    std::vector<float> block_sums, block_errors;  // [tiles][cols / 32][kTileRows]

    // Where row i's code of column c is in codes (and residual_codes).
    size_t code_at(int i, int c) const {
        return (static_cast<size_t>(i / kTileRows) * (cols / 4) + c / 4) * (4 * kTileRows) + 4 * (i % kTileRows) + c % 4;
    }
    // Where row i's value k is in an array of `per_row` values a row (steps: cols / 32, sums: cols / 16).
    static size_t value_at(int i, int k, int per_row) {
        return (static_cast<size_t>(i / kTileRows) * per_row + k) * kTileRows + i % kTileRows;
    }

    void resize(int n, int cols);
    // Rows [i0, i1) of x (row i at x + i * ldx), after resize: disjoint row ranges may be written
    // from different threads.
    void quantize_rows(const float* x, int ldx, int i0, int i1);
};

// y[i * ldy + r] = sum_c x_i[c] w[r][c] for the rows i of xq and weight rows r in [r0, r1), ldy >=
// r1. isa Scalar: the reference. Throws std::out_of_range on a row range outside the matrix,
// std::invalid_argument on an activation of another width, ldy too small, or one rounded once for
// a matrix with Q4_0 / Q4_1 rows.
void multiply_batch(const WeightMatrix& w, const Q8Rows& xq, int r0, int r1, float* y, int ldy, Isa isa);

}  // namespace mnn_h2o
