// AVX-512 VNNI k-quant row kernels of WeightMatrix (weight_matrix_x86.h): one vpdpbusd (unsigned x
// signed bytes summed by four into int32) on 256-bit lanes (AVX512-VL) per activation block.
#if defined(MNN_H2O_HAVE_X86_KERNELS)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 intrinsics (bug 105593)
#endif

#include "weight_matrix_x86.h"

namespace mnn_h2o {

namespace {

struct VnniDot {
    static __m256i dot(__m256i w, __m256i c) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, c); }
};

}  // namespace

void q4_k_rows_avx512vnni(const BlockRows& p, int r0, int r1) { kquant_x86::q4_k_rows<VnniDot>(p, r0, r1); }
void q6_k_rows_avx512vnni(const BlockRows& p, int r0, int r1) { kquant_x86::q6_k_rows<VnniDot>(p, r0, r1); }

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
