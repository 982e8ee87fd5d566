// The contract between the attention dispatcher (attention.cpp) and the per-ISA kernel files.
//
// Kernel files are compiled with their own -m flags, so this header holds declarations and plain
// structs only: an inline function defined here could be emitted by an AVX-512 file and then
// picked by the linker for a caller on a CPU without AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mnn_h2o/attention/attention.h"

namespace mnn_h2o {
namespace kernels {

struct Shape {
    int head_dim;
    int block_tokens;
    KvDtype dtype;
    float scale;  // 1/sqrt(head_dim)
};

// Unnormalised softmax state of n_rows query rows (same position, so the same causal limit) over
// keys [key_begin, key_end) of one kv head; key_begin is a multiple of block_tokens and
// key_begin < key_end. Afterwards, for row r and key j of the range with score s_j:
//   m[r] = max s_j,  l[r] = sum exp(s_j - m[r]),  o[r*head_dim + d] = sum exp(s_j - m[r]) v_j[d]
// and, if block_sums is set, block_sums[r*block_sums_stride + b] = sum over the keys of the
// b-th block of the range of exp(s_j - m[r]); if block_peaks is set too, block_peaks[r *
// block_sums_stride + b] = the largest exp(s_j - m[r]) of the b-th block.
struct DecodeArgs {
    Shape shape;
    const KvHeadView* kv;
    const float* const* q_rows;
    int n_rows;
    int key_begin, key_end;
    float* scratch;  // decode_scratch_floats(shape, n_rows, key_end - key_begin) floats
    float* m;
    float* l;
    float* o;
    float* block_sums;
    size_t block_sums_stride;
    float* block_peaks;  // null, or set with block_sums
    int key_first;       // keys [key_begin, key_first) masked (a sliding window)
};

// Exact attention of up to tile_rows query rows of one kv head; row r sees keys [0, limits[r]),
// limits[r] >= 1, or with starts (a sliding window) keys [starts[r], limits[r]), starts[r] <
// limits[r] (block_scores, window_scores and block_max are then null: attention.cpp refuses them). Writes out_rows[r][0..head_dim) normalised, and if block_scores is set adds to
// block_scores[b] the probability mass of block b summed over the rows; if window_scores is set
// too, adds to window_scores[b] the mass of block b summed over the rows r >= window_first_row;
// if block_max is set (with block_scores), block_max[b] = max(block_max[b], the largest
// probability of a key of block b in any row).
struct TileArgs {
    Shape shape;
    const KvHeadView* kv;
    const float* const* q_rows;
    const uint8_t* const* q8_rows;  // a q8 cache's: the same queries as q8 rows (attention.h), else null
    float* const* out_rows;
    const int* limits;
    int n_rows;
    float* scratch;  // tile_scratch_floats(shape, number of visible blocks) floats
    float* block_scores;
    float* window_scores;  // null, or set with block_scores
    int window_first_row;
    float* block_max;      // null, or set with block_scores
    const int* starts;     // null: every row from key 0
};

struct KernelSet {
    const char* name;  // "avx512-bf16", ...: what attention_kernels_name() reports
    int tile_rows;     // rows per prefill tile
    size_t (*decode_scratch_floats)(const Shape& shape, int n_rows, int n_keys);
    size_t (*tile_scratch_floats)(const Shape& shape, int n_blocks);
    void (*decode)(const DecodeArgs& args);
    void (*tile)(const TileArgs& args);
    // n is a multiple of 16 for the SIMD sets.
    void (*from_f32)(KvDtype dtype, const float* src, void* dst, size_t n);
    void (*to_f32)(KvDtype dtype, const void* src, float* dst, size_t n);
    // hadamard_rows's rows times H, then times scale (= hadamard_scale(n)): the same bits.
    void (*hadamard)(float* rows, size_t n_rows, int n, float scale);
};

const KernelSet& scalar_kernels();
#if defined(MNN_H2O_HAVE_X86_KERNELS)
const KernelSet& avx2_kernels();
const KernelSet& avx512_kernels();
const KernelSet& avx512vnni_kernels();
const KernelSet& avx512bf16_kernels();
#endif
#if defined(__aarch64__)
const KernelSet& neon_kernels();
#endif

}  // namespace kernels
}  // namespace mnn_h2o
