// AVX2 + FMA register tile of the batched product (batched_product_kernels.h): M activation rows
// (up to 6) by the panel's 16 rows in 12 accumulators; per column two panel loads and M
// broadcasts feed 2 M FMAs. AVX-512 machines run it too.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#include <immintrin.h>

#include "batched_product_kernels.h"
#include "mnn_h2o/dense/batched_product.h"

namespace mnn_h2o {

namespace {

template <int M>
void tile(const PanelTile& t, const float* x, float* y) {
    __m256 c[M][2];
    for (int a = 0; a < M; ++a) c[a][0] = c[a][1] = _mm256_setzero_ps();
    for (int k = 0; k < t.kc; ++k) {
        const __m256 w0 = _mm256_load_ps(t.panel + k * kPanelRows), w1 = _mm256_load_ps(t.panel + k * kPanelRows + 8);
        for (int a = 0; a < M; ++a) {
            const __m256 xa = _mm256_broadcast_ss(x + static_cast<size_t>(a) * t.ldx + k);
            c[a][0] = _mm256_fmadd_ps(xa, w0, c[a][0]);
            c[a][1] = _mm256_fmadd_ps(xa, w1, c[a][1]);
        }
    }
    for (int a = 0; a < M; ++a) {
        float* out = y + static_cast<size_t>(a) * t.ldy;
        if (t.width == kPanelRows) {
            if (t.accumulate) {
                c[a][0] = _mm256_add_ps(_mm256_loadu_ps(out), c[a][0]);
                c[a][1] = _mm256_add_ps(_mm256_loadu_ps(out + 8), c[a][1]);
            }
            _mm256_storeu_ps(out, c[a][0]);
            _mm256_storeu_ps(out + 8, c[a][1]);
        } else {
            alignas(32) float v[kPanelRows];
            _mm256_store_ps(v, c[a][0]);
            _mm256_store_ps(v + 8, c[a][1]);
            for (int j = 0; j < t.width; ++j) out[j] = t.accumulate ? out[j] + v[j] : v[j];
        }
    }
}

}  // namespace

void panel_tile_avx2(const PanelTile& t) {
    int i = 0;
    for (; i + 6 <= t.n; i += 6) tile<6>(t, t.x + static_cast<size_t>(i) * t.ldx, t.y + static_cast<size_t>(i) * t.ldy);
    const float* x = t.x + static_cast<size_t>(i) * t.ldx;
    float* y = t.y + static_cast<size_t>(i) * t.ldy;
    switch (t.n - i) {
        case 5: tile<5>(t, x, y); break;
        case 4: tile<4>(t, x, y); break;
        case 3: tile<3>(t, x, y); break;
        case 2: tile<2>(t, x, y); break;
        case 1: tile<1>(t, x, y); break;
        default: break;
    }
}

}  // namespace mnn_h2o

#endif  // MNN_H2O_HAVE_X86_KERNELS
