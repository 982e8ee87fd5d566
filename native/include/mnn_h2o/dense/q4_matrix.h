// A GGUF 4-bit matrix (Q4_0 / Q4_1, blocks of 32) times one activation row rounded to int8 per
// block of 32: the decode layers' products (mnn_h2o/dense/decode_layers.h).
//
// Why integer activations: an int4 x float product is bound by widening the codes to float (about
// 3x MNN's per-token time here); with both sides integer, one VNNI or maddubs instruction does 32
// multiply-adds. The activation is rounded twice per block of 32: to int8 codes, then what that
// left to int8 residual codes, so x = scale * code + residual_scale * residual_code to about 1 /
// 32000 of the block's largest value. One rounding alone (llama.cpp's q8_0) made the decode 5-10x
// noisier than MNN's int8 modules (KL 0.010-0.012 between f16 and q8 KV, against MNN's 0.0016:
// Q4_1's codes are all positive, so their products are large and cancel against the mins');
// the second costs two more dot products per block, and the products are memory bound. The
// blocks' mins (Q4_1) meet the float sum of x.
//
// Input layout (the GGUF's): row r holds cols / 32 blocks; block b's 16 bytes are
// nibbles[(r * cols + 32 b) / 2 ..]; byte j holds value j in its low nibble and value j + 16 in its
// high one. Value i of the block is nibble_i * scale + min, scale and min fp16 per block; Q4_0's
// (nibble - 8) * d is nibble * d + (-8 d).
//
// Held layout: blocks in pairs (a row's odd last block is paired with a zero block), so that one
// 32-byte load holds two blocks' nibbles: its low nibbles are values 0-15 of both blocks, its high
// nibbles values 16-31. The activation's codes are stored in that order (Q8Activation), and each
// pair's fp16 scales and mins sit together as {scale a, scale b, min a, min b}: one 8-byte load.
// Bytes per weight: 0.5 + 4 / 32 (the GGUF's 20 bytes per block of Q4_1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mnn_h2o/runtime/cpu_features.h"

namespace mnn_h2o {

constexpr int kQ4Block = 32;

// One activation row rounded twice per block of 32: value i of block b ~ scales[b] * code +
// residual_scales[b] * residual_code (each round to nearest, |code| <= 127); sums[b] is the float
// sum of the block's values, unrounded. Codes in pair order: blocks 2p and 2p + 1 take the 64
// bytes codes[64 p ..] as {2p: 0-15, 2p + 1: 0-15, 2p: 16-31, 2p + 1: 16-31}; a missing odd block
// is zeros; residual_codes alike. pair_* repeat each pair's two scales (and sums / 4) four times
// ({a, a, a, a, b, b, b, b}): the SIMD kernels' lanes.
//
// The k-quant form, for the kernels of weight_matrix.h (where cols is a multiple of 256; else
// empty): the row rounded once, with the steps of one super-block of 256 values tied together so
// that a super-block's integer dots can be summed before any float: value i of block b in
// super-block k ~ super_steps[k] * multipliers[b] * seq_codes[i], codes in the row's own order,
// multipliers integers 1..kMaxMultiplier (the super-block's step is its largest block's amax / 127
// / kMaxMultiplier; each block takes the smallest multiple of it that holds its own amax in 127
// codes, so a block's step is within 1 / multiplier of its own amax / 127). rounding_errors[b]:
// the float sum of the block's values minus that of their rounded values; rounded_sums16: the
// sums of the rounded values per 16 (Q6_K's offset of 32).
//
// Why one rounding is enough here, where the pair form needs two: a k-quant weight is an unsigned
// code n times a scale, less a min (Q6_K: less 32 steps), so the rounding errors e_i meet the
// weights as sum n_i e_i, large where n's mean is far from 0. The kernels take the errors' part
// at the codes' centre c exactly, from the activation's rounding_errors (c sum e_i; Q6_K: its
// offset against the rounded sums), so only sum (n_i - c) e_i is left. On the 1.5B's decode (64
// teacher-forced tokens, KL to the exact model): one plain rounding 0.0058, centred 0.0010, with
// integer multipliers instead of powers of two 0.00044; two roundings were 0.00006 at about 1.4x
// the time of a token (docs/results.md, Qwen2.5-Coder-1.5B).
struct Q8Activation {
    static constexpr int kMaxMultiplier = 128;
    // Whether resize makes (and quantize writes) the k-quant form: its consumers are k-quant
    // matrices only, so the decode layers turn it off where none reads it (set before resize).
    bool kquant_form = true;
    // Likewise the pair form (codes, residual_codes, scales, residual_scales, pair_*): its
    // consumers are Q4 matrices and Q5_0 / Q8_0 rows; without it an activation is its sums and
    // the k-quant form (two roundings of every block less: ~1 ms a decode token on the 1.5B).
    bool pair_form = true;
    int cols = 0;
    std::vector<int8_t> codes, residual_codes;
    std::vector<float> scales, residual_scales, sums;
    std::vector<float> pair_scales, pair_residual_scales, pair_sums;
    std::vector<int8_t> seq_codes;
    std::vector<float> super_steps, rounding_errors, rounded_sums16;
    std::vector<int16_t> multipliers;

    void resize(int cols);                 // cols a multiple of 32 (the callers' widths are)
    void quantize(const float* x, int cols);  // resize(cols) if the width changed, then every block
    // Blocks [b0, b1) of x (x points at the row's start), after resize: for callers that produce
    // the row block by block (disjoint blocks may be written from different threads). The
    // k-quant form of super-block k needs its 8 blocks: it is written with block 8 k + 7.
    void quantize_blocks(const float* x, int b0, int b1);
};

class Q4Matrix {
public:
    // nibbles rows * cols / 2 bytes, scales and mins rows * cols / 32 fp16 bits, in the GGUF's
    // layout. Throws std::invalid_argument unless rows > 0, cols > 0, cols % 32 == 0 and the
    // sizes match.
    Q4Matrix(int rows, int cols, const std::vector<uint8_t>& nibbles, const std::vector<uint16_t>& scales,
             const std::vector<uint16_t>& mins);

    int rows() const { return rows_; }
    int cols() const { return cols_; }
    size_t bytes() const { return nibbles_.size() + scale_mins_.size() * sizeof(uint16_t); }

    // y[r - r0] for rows r in [r0, r1): the sum over blocks of scale * (x.scales[b] * (integer dot
    // of nibbles and codes) + x.residual_scales[b] * (that of the residual codes)) + min * x.sums[b]. isa: Scalar is the reference (float sums in block
    // order); the SIMD paths compute the same integer dots and sum the floats in another order.
    void multiply_rows(const Q8Activation& x, int r0, int r1, float* y, Isa isa) const;

    // Row r's blocks [b0, b1) (32 values each) in the weight types' integer form (weight_types.h:
    // value = u a + b per group of 16; here u the nibble, a the scale, b the min): the batched
    // product's weights (dense/batched_product.h).
    void integer_row(int r, int b0, int b1, uint8_t* u, float* a, float* b) const;
    // Asks the caches for what integer_row(r, b0, b1) reads (a hint; out of range: nothing).
    void prefetch_row(int r, int b0, int b1) const;

private:
    int rows_, cols_, pairs_;  // pairs_: block pairs per row
    std::vector<uint8_t> nibbles_;       // [rows][pairs][32]
    std::vector<uint16_t> scale_mins_;   // [rows][pairs][4]: scale a, scale b, min a, min b
};

}  // namespace mnn_h2o
