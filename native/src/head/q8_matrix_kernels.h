// Internal to q8_matrix: the SIMD row kernels. Each computes y[t * y_stride + r] for rows
// [r0, r1) and activation rows t in [0, n) (x is [n][cols]), as the scalar reference in
// q8_matrix.cpp does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../runtime/prefetch_ahead.h"
#include "mnn_h2o/head/q8_matrix.h"

namespace mnn_h2o {

// One call's operands (named apart from dense's Q8Rows: one name, one class in the program).
struct HeadRowsProblem {
    const int8_t* codes;
    const uint16_t* scales;
    int cols;
    const float* x;
    int n;
    float* y;
    size_t y_stride;
};

// The loop every kernel shares: y[t][r] = dot(row r's codes, its scales, activation row t, blocks
// per row) for rows [r0, r1); each ISA supplies its dot of one row with one activation row.
template <class Dot>
inline void for_each_row(const HeadRowsProblem& p, int r0, int r1, Dot dot) {
    const int nb = p.cols / kQ8Block;
    for (int r = r0; r < r1; ++r) {
        const int8_t* c = p.codes + static_cast<size_t>(r) * p.cols;
        const uint16_t* s = p.scales + static_cast<size_t>(r) * nb;
        for (int t = 0; t < p.n; ++t) p.y[static_cast<size_t>(t) * p.y_stride + r] = dot(c, s, p.x + static_cast<size_t>(t) * p.cols, nb);
    }
}

#if defined(MNN_H2O_HAVE_X86_KERNELS)
void q8_rows_avx2(const HeadRowsProblem& p, int r0, int r1);
void q8_rows_avx512(const HeadRowsProblem& p, int r0, int r1);
#endif
#if defined(__aarch64__)
void q8_rows_neon(const HeadRowsProblem& p, int r0, int r1);
#endif

}  // namespace mnn_h2o
