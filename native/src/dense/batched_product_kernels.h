// Internal to batched_product: the panel kernels, each adding one unpacked panel's products into y
// as the scalar reference in batched_product.cpp does (dense/batched_product.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace mnn_h2o {

// One panel: kPanelRows weight rows by kc columns (kc a multiple of 32) in the integer form.
struct PanelTile {
    // u: column c of panel row j at u[(c / 4) * 64 + 4 j + c % 4]: four columns of the 16 rows in
    // 64 bytes, one 32-bit lane a row (vpdpbusd's operand).
    const uint8_t* u;
    const float* a;      // group g (`group` columns) of row j at a[g * kPanelRows + j]
    const float* b;      // likewise
    const float* centre; // likewise: a times the group's mean u (the rounding errors' weight)
    int group;           // 16 or 32: columns sharing a, b and centre (the activation's sums per group)
    int kc;
    const int8_t* codes;           // activation row i's code of column 0 of the panel at codes + i * ldc
    const int8_t* residual_codes;  // likewise, nullptr where the activation is rounded once
    int ldc;
    const float* steps;            // its block step of the panel's first block at steps + i * lds
    const float* residual_steps;   // likewise (nullptr with residual_codes)
    int lds;
    const float* sums;    // its sum over the panel's first group at sums + i * ldg (Q8Rows' sums or block_sums)
    const float* errors;  // its rounding error there likewise
    int ldg;
    int n;               // activation rows
    float* y;            // output row i's panel row 0 at y + i * ldy
    int ldy;
    int width;           // panel rows that exist (<= kPanelRows; the rest of the panel is zeros)
    bool accumulate;     // add to y (a later column panel) instead of storing
};

using PanelKernel = void (*)(const PanelTile&);

// Activation row i of a tile: where its codes, steps and group sums of the panel start.
struct TileRow {
    const int8_t *codes, *residual_codes;
    const float *steps, *residual_steps, *sums, *errors;
    TileRow() = default;
    TileRow(const PanelTile& t, int i)
        : codes(t.codes + static_cast<size_t>(i) * t.ldc),
          residual_codes(t.residual_codes ? t.residual_codes + static_cast<size_t>(i) * t.ldc : nullptr),
          steps(t.steps + static_cast<size_t>(i) * t.lds),
          residual_steps(t.residual_steps ? t.residual_steps + static_cast<size_t>(i) * t.lds : nullptr),
          sums(t.sums + static_cast<size_t>(i) * t.ldg),
          errors(t.errors + static_cast<size_t>(i) * t.ldg) {}
};

// Four consecutive codes as one 32-bit word (the lane a kernel broadcasts).
inline int32_t four_codes(const int8_t* c) {
    int32_t v;
    std::memcpy(&v, c, 4);
    return v;
}

void panel_tile_scalar(const PanelTile& t);
#if defined(MNN_H2O_HAVE_X86_KERNELS)
void panel_tile_avx2(const PanelTile& t);
void panel_tile_avx512vnni(const PanelTile& t);
#endif
#if defined(__aarch64__)
void panel_tile_neon(const PanelTile& t);
#endif

}  // namespace mnn_h2o
