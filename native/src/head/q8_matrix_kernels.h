// Internal to q8_matrix: the SIMD row kernels. Each computes y[t * y_stride + r] for rows
// [r0, r1) and activation rows t in [0, n) (x is [n][cols]), as the scalar reference in
// q8_matrix.cpp does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnn_h2o {

struct Q8Rows {
    const int8_t* codes;
    const uint16_t* scales;
    int cols;
    const float* x;
    int n;
    float* y;
    size_t y_stride;
};

#if defined(MNN_H2O_HAVE_X86_KERNELS)
void q8_rows_avx2(const Q8Rows& p, int r0, int r1);
void q8_rows_avx512(const Q8Rows& p, int r0, int r1);
#endif
#if defined(__aarch64__)
void q8_rows_neon(const Q8Rows& p, int r0, int r1);
#endif

}  // namespace mnn_h2o
