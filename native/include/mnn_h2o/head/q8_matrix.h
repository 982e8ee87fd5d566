// The output projection (lm_head) as llama.cpp's q8_0 rows times float activations.
//
// Why it is ours and not an MNN module: MNN's fast int8 kernels (memory mode low) quantise the
// activation too, per block, on every call. At the head that rounding reaches the logits
// directly: it was a third of the KL that q8 KV alone costs against our f16 cache (the "int8
// floor", docs/results.md), and MNN's float mode for the head is 1.24x slower per token. Here the
// weights stay q8_0 (the bytes MNN reads) and the activation stays float: the same speed, no
// activation rounding. The native tail (mnn_h2o/native_tail.py) runs the last layer's four
// matrices on it too, their Q4_1 codes (0..15) and scales as such, adding the blocks' mins itself.
//
// Layout: row r holds cols / 32 blocks; block b is 32 int8 codes codes[r * cols + 32 b ..] with
// the scale fp16 scales[r * (cols / 32) + b]; its value i is codes[..+ i] * float(scale).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/runtime/thread_pool.h"

namespace mnn_h2o {

constexpr int kQ8Block = 32;

class Q8Matrix {
public:
    // Copies the codes (rows * cols) and scales (rows * cols / 32). Throws std::invalid_argument
    // unless rows > 0, cols > 0, cols % 32 == 0 and the sizes match. n_threads counts the caller.
    Q8Matrix(int rows, int cols, std::vector<int8_t> codes, std::vector<uint16_t> scales,
             int n_threads);

    int rows() const { return rows_; }
    int cols() const { return cols_; }
    size_t bytes() const { return codes_.size() + scales_.size() * sizeof(uint16_t); }

    // y[t][r] = sum over c of x[t][c] * value(r, c), for t in [0, n): x is [n][cols], y [n][rows].
    // isa: Scalar is the reference (float sums per block, in order); Avx2 / Avx512 / Neon the SIMD
    // paths (the same products, summed in another order), used when compiled in and supported,
    // else the reference.
    void multiply(const float* x, int n, float* y, Isa isa) const;
    // The rows [r0, r1) of multiply's y (still [n][rows]) on the calling thread: the decode
    // layers run a token's head as tasks on their own team (DecodeLayers::set_head). A row's
    // floats do not depend on which task computed it.
    void multiply_rows(const float* x, int n, int r0, int r1, float* y, Isa isa) const;

    // out[t][c] = value(ids[t], c) = code * scale, exactly (float32 holds an int8 times an fp16
    // exactly), for t in [0, n): a tied embedding's rows read from the head's own codes, so the
    // process holds one copy. Throws std::out_of_range for an id outside [0, rows).
    void rows_of(const int32_t* ids, int n, float* out) const;

private:
    int rows_, cols_;
    std::vector<int8_t> codes_;
    std::vector<uint16_t> scales_;
    std::unique_ptr<ThreadPool> pool_;
};

}  // namespace mnn_h2o
