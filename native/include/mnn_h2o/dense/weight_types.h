// The GGUF weight block types the core reads: one table entry per type (ggml's type_traits is the
// model), read by WeightMatrix (the decode layers' products), the bindings and, through them, the
// export. A type missing here is refused by name wherever a matrix of it is built.
//
// Block layouts (ggml's, little-endian; fp16 = IEEE half; value i of a block):
//   Q4_0  18 bytes / 32 values: d fp16, qs[16];  v = (n_i - 8) d, n_i = qs[i] & 15 (i < 16),
//         qs[i - 16] >> 4 (i >= 16)
//   Q4_1  20 bytes / 32 values: d fp16, m fp16, qs[16];  v = n_i d + m (n_i as Q4_0's)
//   Q5_0  22 bytes / 32 values: d fp16, qh[4], qs[16];  v = (n_i - 16) d, n_i = Q4_0's nibble plus
//         16 times bit i of qh (read as one little-endian 32-bit word)
//   Q8_0  34 bytes / 32 values: d fp16, qs[32] int8;  v = qs[i] d
//   Q4_K 144 bytes / 256 values: d fp16, dmin fp16, scales[12], qs[128]. Eight sub-blocks of 32,
//         sub-block j with a 6-bit scale s_j and min m_j packed in scales[] (j < 4: s = sc[j] & 63,
//         m = sc[j + 4] & 63; j >= 4: s = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4,
//         m = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4). Values 64 g .. 64 g + 63 (g = 0..3) come from
//         qs[32 g .. 32 g + 31]: the low nibbles are sub-block 2g, the high ones 2g + 1;
//         v = d s_j n - dmin m_j.
//   Q5_K 176 bytes / 256 values: d fp16, dmin fp16, scales[12], qh[32], qs[128]. Q4_K's sub-blocks,
//         scales, mins and nibbles (qs at byte 48), and a fifth bit: value l of sub-block j
//         (l = 0..31) adds 16 ((qh[l] >> j) & 1); v = d s_j (n + 16 h) - dmin m_j.
//   Q6_K 210 bytes / 256 values: ql[128], qh[64], scales[16] int8, d fp16. Sixteen sub-blocks of
//         16, v = d scales[i / 16] (q_i - 32) with the 6-bit q_i, for half h = 0, 1 (values
//         128 h ..) and l = 0..31, L = ql + 64 h, H = qh + 32 h:
//           q[l]      = (L[l] & 15)      | (H[l] & 3) << 4
//           q[l + 32] = (L[l + 32] & 15) | (H[l] >> 2 & 3) << 4
//           q[l + 64] = (L[l] >> 4)      | (H[l] >> 4 & 3) << 4
//           q[l + 96] = (L[l + 32] >> 4) | (H[l] >> 6 & 3) << 4
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mnn_h2o {

// ggml's type ids (the GGUF's tensor type field).
enum class WeightType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// How WeightMatrix holds a type's blocks: repacked into Q4Matrix's block pairs (its own kernels,
// dense/q4_matrix.h), or as the GGUF stores them with row kernels of their own (dense/
// weight_matrix.cpp).
enum class HeldAs { Q4Pairs, GgufBlocks };

struct WeightTypeTraits {
    WeightType type;
    const char* name;    // ggml's name: "Q4_K"
    int block_values;    // values per block
    int block_bytes;     // bytes per block
    HeldAs held;
    // Byte offsets in a block of its fp16 scale fields (d, and m / dmin where there is one; -1:
    // none): the load checks each is finite.
    int half_offsets[2];
    // The reference decoding of n_blocks consecutive blocks into n_blocks * block_values floats
    // (every fp16 converted exactly; products in float as ggml's dequantisers form them).
    void (*dequantize)(const uint8_t* blocks, float* out, size_t n_blocks);
    // The same values as a u + b per group of 16 (kIntegerGroup), u an unsigned byte (at most 63
    // but for Q8_0's q + 128, which the batched product splits as 64 (u >> 6) + (u & 63)): u gets
    // n_blocks * block_values bytes, a and b one float per group (nullptr: not in this form). The
    // batched product's form (dense/batched_product.h): its integer dots take u.
    void (*integer_form)(const uint8_t* blocks, uint8_t* u, float* a, float* b, size_t n_blocks);
    // Columns that share one a and b in that form: 32 where a block or sub-block holds 32 values
    // (Q4_K's), 16 for Q6_K's sub-blocks. The batched product meets the floats once per such group.
    int integer_group;
};

constexpr int kIntegerGroup = 16;

// The entry of a type; throws std::invalid_argument naming the id for one the table lacks.
const WeightTypeTraits& weight_traits(WeightType type);
const WeightTypeTraits& weight_traits(int ggml_id);
// The entry of ggml's name ("Q4_K"), or nullptr.
const WeightTypeTraits* find_weight_traits(const std::string& name);
// Every entry, in id order (for error messages and the bindings).
const WeightTypeTraits* weight_traits_table(size_t* count);

// Bytes of a row of `cols` values; throws std::invalid_argument unless cols is a positive multiple
// of the type's block.
size_t weight_row_bytes(const WeightTypeTraits& t, int cols);

}  // namespace mnn_h2o
