// Internal to batched_product: the register-tile kernels, each adding one decoded panel's products
// into y as the scalar reference in batched_product.cpp does (dense/batched_product.h).
#pragma once

namespace mnn_h2o {

struct PanelTile {
    const float* panel;  // [kc][kPanelRows]: column c's value of the panel's row j at panel[c * kPanelRows + j]
    int kc;              // columns in this panel
    const float* x;      // activation row i's column 0 of the panel at x + i * ldx
    int ldx;
    int n;               // activation rows
    float* y;            // output row i's panel row 0 at y + i * ldy
    int ldy;
    int width;           // panel rows that exist (<= kPanelRows; the rest of the panel is zeros)
    bool accumulate;     // add to y (a later column panel) instead of storing
};

using PanelKernel = void (*)(const PanelTile&);

void panel_tile_scalar(const PanelTile& t);
#if defined(MNN_H2O_HAVE_X86_KERNELS)
void panel_tile_avx2(const PanelTile& t);
#endif
#if defined(__aarch64__)
void panel_tile_neon(const PanelTile& t);
#endif

}  // namespace mnn_h2o
