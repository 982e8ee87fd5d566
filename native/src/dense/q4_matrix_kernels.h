// Internal to q4_matrix: the row kernels, each computing y[r - r0] for rows [r0, r1) as the scalar
// reference in q4_matrix.cpp does (layouts: q4_matrix.h).
#pragma once

#include <cstdint>

#include "mnn_h2o/dense/q4_matrix.h"

namespace mnn_h2o {

struct Q4Rows {
    const uint8_t* nibbles;      // [rows][pairs][32]
    const uint16_t* scale_mins;  // [rows][pairs][4]
    int pairs;
    const Q8Activation* x;
    float* y;
};

#if defined(MNN_H2O_HAVE_X86_KERNELS)
void q4_rows_avx2(const Q4Rows& p, int r0, int r1);
void q4_rows_avx512vnni(const Q4Rows& p, int r0, int r1);
#endif
#if defined(__aarch64__)
void q4_rows_neon(const Q4Rows& p, int r0, int r1);
#endif

}  // namespace mnn_h2o
