// NEON register tile of the batched product (batched_product_kernels.h): M activation rows (up to
// 6) by the panel's 16 rows in 24 accumulators of four lanes; per column four panel loads and M
// broadcasts feed 4 M fused multiply-adds.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "batched_product_kernels.h"
#include "mnn_h2o/dense/batched_product.h"

namespace mnn_h2o {

namespace {

template <int M>
void tile(const PanelTile& t, const float* x, float* y) {
    float32x4_t c[M][4];
    for (int a = 0; a < M; ++a)
        for (int v = 0; v < 4; ++v) c[a][v] = vdupq_n_f32(0.f);
    for (int k = 0; k < t.kc; ++k) {
        const float* p = t.panel + k * kPanelRows;
        const float32x4_t w[4] = {vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)};
        for (int a = 0; a < M; ++a) {
            const float32x4_t xa = vdupq_n_f32(x[static_cast<size_t>(a) * t.ldx + k]);
            for (int v = 0; v < 4; ++v) c[a][v] = vfmaq_f32(c[a][v], xa, w[v]);
        }
    }
    for (int a = 0; a < M; ++a) {
        float* out = y + static_cast<size_t>(a) * t.ldy;
        float v[kPanelRows];
        for (int q = 0; q < 4; ++q) vst1q_f32(v + 4 * q, c[a][q]);
        for (int j = 0; j < t.width; ++j) out[j] = t.accumulate ? out[j] + v[j] : v[j];
    }
}

}  // namespace

void panel_tile_neon(const PanelTile& t) {
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

#endif  // __aarch64__
