#include "mnn_h2o/dense/batched_product.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "batched_product_kernels.h"

namespace mnn_h2o {

void panel_tile_scalar(const PanelTile& t) {
    for (int i = 0; i < t.n; ++i) {
        const float* x = t.x + static_cast<size_t>(i) * t.ldx;
        float* y = t.y + static_cast<size_t>(i) * t.ldy;
        for (int j = 0; j < t.width; ++j) {
            float acc = 0.f;
            for (int c = 0; c < t.kc; ++c) acc += x[c] * t.panel[c * kPanelRows + j];
            y[j] = t.accumulate ? y[j] + acc : acc;
        }
    }
}

namespace {

PanelKernel panel_kernel(Isa isa) {
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma) return panel_tile_avx2;
#elif defined(__aarch64__)
    if (isa == Isa::Neon) return panel_tile_neon;
#endif
    (void)isa;
    return panel_tile_scalar;
}

}  // namespace

void multiply_batch(const WeightMatrix& w, const float* x, int n, int ldx, int r0, int r1, float* y, int ldy, Isa isa) {
    if (r0 < 0 || r1 > w.rows() || r0 > r1) throw std::out_of_range("multiply_batch: rows out of range");
    if (n < 0 || ldx < w.cols() || ldy < r1)
        throw std::invalid_argument("multiply_batch: n " + std::to_string(n) + ", ldx " + std::to_string(ldx) +
                                    " (cols " + std::to_string(w.cols()) + "), ldy " + std::to_string(ldy) +
                                    " (rows to " + std::to_string(r1) + ")");
    if (n == 0 || r0 == r1) return;
    const PanelKernel kernel = panel_kernel(isa);
    alignas(64) float panel[kPanelCols * kPanelRows];
    alignas(64) float row[kPanelCols];
    const int cols = w.cols();
    for (int p0 = r0; p0 < r1; p0 += kPanelRows) {
        const int width = std::min(kPanelRows, r1 - p0);
        for (int c0 = 0; c0 < cols; c0 += kPanelCols) {
            const int kc = std::min(kPanelCols, cols - c0);
            for (int j = 0; j < kPanelRows; ++j) {
                if (j < width) {
                    w.dequantize_row(p0 + j, c0, c0 + kc, row);
                    for (int c = 0; c < kc; ++c) panel[c * kPanelRows + j] = row[c];
                } else {
                    for (int c = 0; c < kc; ++c) panel[c * kPanelRows + j] = 0.f;
                }
            }
            kernel(PanelTile{panel, kc, x + c0, ldx, n, y + p0, ldy, width, c0 > 0});
        }
    }
}

}  // namespace mnn_h2o
