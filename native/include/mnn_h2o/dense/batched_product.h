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
// i ~ steps[i][c / 32] * codes[i][c] (+ residual_steps[i][c / 32] * residual_codes[i][c] where
// residual: the remainder rounded again) (round to nearest, |code| <= 127, step = amax / 127 of
// what is rounded), sums[i][c / 16] the float sum of the group's unrounded values, errors[i][c /
// 16] what the roundings left of it (summed as differences), block_sums / block_errors the same
// per block of 32 (the two groups' added). k-quant rows read the codes alone,
// Q4_0 / Q4_1 rows (as their pair form, q4_matrix.h) both: on SmolLM2's Q4_1 prompts one centred
// rounding cost KL 0.0015 to the exact model (MNN's int8 modules 0.0006, two roundings 5e-7), on
// the 1.5B's k-quant prompts 0.0007 (two: 4e-6) for 1.4x the prefill speed
// (docs/notebook/kquant_one_rounding.md).
struct Q8Rows {
    bool residual = true;  // whether resize makes (and quantize_rows writes) the residual codes
    int n = 0, cols = 0;
    std::vector<int8_t> codes, residual_codes;  // [n][cols]
    std::vector<float> steps, residual_steps;   // [n][cols / 32]
    std::vector<float> sums, errors;            // [n][cols / 16]
    std::vector<float> block_sums, block_errors;  // [n][cols / 32]

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
