// AVX2 k-quant row kernels of WeightMatrix (weight_matrix_x86.h): maddubs of the unsigned codes
// with the activation's (at most 2 x 63 x 127 per int16: no saturation), madd into int32.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include "weight_matrix_x86.h"

namespace mnn_h2o {

namespace {

struct MaddubsDot {
    static __m256i dot(__m256i w, __m256i c) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(w, c), _mm256_set1_epi16(1));
    }
};

}  // namespace

void q4_k_rows_avx2(const BlockRows& p, int r0, int r1) { kquant_x86::q4_k_rows<MaddubsDot>(p, r0, r1); }
void q6_k_rows_avx2(const BlockRows& p, int r0, int r1) { kquant_x86::q6_k_rows<MaddubsDot>(p, r0, r1); }

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
