// A matrix of GGUF weight blocks times many activation rows at once: a prompt chunk's products in
// the decode layers (dense/decode_layers.h), Y = X W^T.
//
// Why not the one-row kernels n times: they decode every block's integers again for each row, and
// round each activation row twice to int8 first (q4_matrix.h). Here a panel of kPanelRows weight
// rows is decoded to float once per kPanelCols columns (WeightMatrix::dequantize_row, the type's
// reference dequantiser), and each decoded value multiplies every activation row: the decoding
// costs 1/n of what it costs a one-row product, the products are float multiply-adds (an FMA
// register tile on SIMD), and no activation is rounded. Below kMinRows rows the decoding is
// not paid back, and the callers use the one-row kernels.
//
// Summation order: for each output, the column panels in order, and within one panel the columns
// in order (the scalar path with a separate multiply and add, the SIMD paths with FMA): the same
// for any split of the rows over threads.
#pragma once

#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/runtime/cpu_features.h"

namespace mnn_h2o {

constexpr int kPanelRows = 16;
constexpr int kPanelCols = 256;
constexpr int kMinRows = 16;

// y[i * ldy + r] = sum_c x[i * ldx + c] w[r][c] for activation rows i < n and weight rows r in
// [r0, r1). ldx >= w.cols(), ldy >= r1. isa Scalar: the reference. Throws std::out_of_range on a
// row range outside the matrix, std::invalid_argument on n < 0 or strides too small.
void multiply_batch(const WeightMatrix& w, const float* x, int n, int ldx, int r0, int r1, float* y, int ldy, Isa isa);

}  // namespace mnn_h2o
