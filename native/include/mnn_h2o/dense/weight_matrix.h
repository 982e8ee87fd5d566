// A matrix of GGUF weight blocks times one activation row rounded to int8 (Q8Activation,
// dense/q4_matrix.h): the decode layers' products, for every type whose traits
// (dense/weight_types.h) say the decode layers hold it.
//
// A matrix is a stack of row segments, each one GGUF tensor of its own type: a Q4_K_M file stores
// a layer's attn_q and attn_k as Q4_K and often attn_v as Q6_K, and the decode layers compute the
// three as one product (rows q, k, v). Q4_0 / Q4_1 segments are held as Q4Matrix's block pairs
// (on the activation rounded twice per block of 32); Q5_0 / Q8_0 segments as the GGUF's bytes, on
// the pair form's first rounding (per block b its step S_b and codes):
//   Q5_0 / Q8_0: per block of 32, d S_b dot(w, codes), w the signed codes (Q5_0: n - 16)
// and k-quant segments as the GGUF's bytes, read by the row kernels of weight_matrix.cpp on the
// activation's k-quant form (q4_matrix.h: rounded once; per super-block k a step T_k, per block b
// of 32 an integer multiplier f_b, the block's rounding error E_b and, per 16 values, the rounded
// sums X16):
//   Q4_K: per sub-block j of 32 (activation block b), d s_j (T_k f_b dot(n, codes) + 7.5 E_b)
//         - dmin m_j x.sums[b]
//   Q5_K: as Q4_K, n the 5-bit values (the nibble plus 16 times the fifth bit), centre 15.5
//   Q6_K: per sub-block of 16, d sc (T_k f_b dot(q, codes) - 32 X16), q the unsigned 6-bit values
// with integer dots (the scalar reference sums them in float in block order; the SIMD paths sum a
// super-block's s_j f_b products in int32 first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mnn_h2o/dense/q4_matrix.h"
#include "mnn_h2o/dense/weight_types.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/runtime/huge_page_bytes.h"

namespace mnn_h2o {

class WeightMatrix {
public:
    // A view of the caller's bytes, read only while the constructor runs: the matrix keeps its
    // own copy (on huge pages), so a GGUF's tensor is never held twice beyond that copy. Or, with
    // no bytes, a fill that writes them into the matrix's own memory (a file read straight into
    // it: not even for a moment held twice).
    struct Part {
        WeightType type;
        int rows;
        const uint8_t* blocks;  // rows * weight_row_bytes(type, cols) bytes, the GGUF's blocks
        size_t bytes;
        std::function<void(uint8_t* dst)> fill;  // where blocks is null: writes the bytes to dst
        Part(WeightType t, int r, const uint8_t* b, size_t n) : type(t), rows(r), blocks(b), bytes(n) {}
        Part(WeightType t, int r, const std::vector<uint8_t>& b) : Part(t, r, b.data(), b.size()) {}
        Part(WeightType t, int r, size_t n, std::function<void(uint8_t*)> f)
            : type(t), rows(r), blocks(nullptr), bytes(n), fill(std::move(f)) {}
    };

    // The parts' rows stacked in order, each part's blocks as the GGUF stores them. Throws
    // std::invalid_argument, naming the part, on a type the decode layers do not hold, a width
    // that is not a whole number of its blocks (or of 32), a byte count that does not match, or a
    // block scale that is not finite.
    WeightMatrix(int cols, const std::vector<Part>& parts);
    WeightMatrix() = default;

    int rows() const { return rows_; }
    int cols() const { return cols_; }
    size_t bytes() const;  // the weights held
    // The parts' types, top to bottom ("Q4_K+Q4_K+Q6_K").
    std::string type_names() const;
    // Whether a part reads the activation's k-quant form (q4_matrix.h).
    bool reads_kquant_form() const;
    // Whether a part of it reads the activation's pair form (Q8Activation::pair_form).
    bool reads_pair_form() const;
    // Whether a part is Q4_0 / Q4_1, held in block pairs, whose products take the activation
    // rounded twice (its pair form's residual too), in a prompt's batched product as well
    // (dense/batched_product.h). Q5_0 / Q8_0 read the pair form's first rounding only.
    bool reads_twice_rounded() const;

    // y[r - r0] for rows [r0, r1); x must have cols values. isa Scalar: the reference.
    void multiply_rows(const Q8Activation& x, int r0, int r1, float* y, Isa isa) const;

    // Row r's columns [c0, c1) in the weight types' integer form (weight_types.h: value = u a + b
    // per group of 16): u gets c1 - c0 bytes, a and b (c1 - c0) / 16 floats. The batched product's
    // weights (dense/batched_product.h). c0 and c1 must be whole blocks of the row's type (256 for a
    // k-quant part); throws std::out_of_range otherwise.
    void integer_row(int r, int c0, int c1, uint8_t* u, float* a, float* b) const;
    // Asks the caches for the bytes integer_row(r, c0, c1) will read: a hint, no effect on any
    // result; rows or columns outside the matrix ask for nothing.
    void prefetch_row(int r, int c0, int c1) const;
    // The columns sharing one a and b for every row in [r0, r1) (their types' integer_group: 32,
    // or 16 where a Q6_K row is among them). Throws std::out_of_range on rows outside the matrix.
    int integer_group(int r0, int r1) const;

private:
    struct Segment {
        const WeightTypeTraits* traits;
        int row0, rows;
        size_t row_bytes;
        std::shared_ptr<const HugePageBytes> blocks;  // k-quants, Q5_0, Q8_0: the GGUF's bytes
        std::shared_ptr<Q4Matrix> q4;    // Q4_0 / Q4_1: the block pairs
    };
    // The segment holding row r (0 <= r < rows_), and where its row r's block holding column c
    // starts in that segment's GGUF bytes (a k-quant / Q5_0 / Q8_0 segment).
    const Segment& segment_of(int r) const;
    static const uint8_t* block_at(const Segment& s, int r, int c);
    int rows_ = 0, cols_ = 0;
    std::vector<Segment> segments_;
};

}  // namespace mnn_h2o
