// Internal to batched_product: the panel kernels, each adding one unpacked panel's products into y
// as the scalar reference in batched_product.cpp does (dense/batched_product.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mnn_h2o/dense/batched_product.h"

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
    // The activation (Q8Rows, tile by tile): tile 0's codes of the panel's first column, tile k's
    // at + k * tile_codes (residual_codes likewise, nullptr where the activation is rounded once).
    const int8_t* codes;
    const int8_t* residual_codes;
    size_t tile_codes;
    const float* steps;            // tile 0's steps of the panel's first block; tile k's at + k * tile_steps
    const float* residual_steps;   // likewise (nullptr with residual_codes)
    size_t tile_steps;
    const float* sums;    // tile 0's sums of the panel's first group (Q8Rows' sums or block_sums), tile k's at + k * tile_sums
    const float* errors;  // its rounding errors likewise
    size_t tile_sums;
    int n;               // activation rows (the tiles hold them padded to a multiple of Q8Rows::kTileRows)
    float* y;            // output row i's panel row 0 at y + i * ldy
    int ldy;
    int width;           // panel rows that exist (<= kPanelRows; the rest of the panel is zeros)
    bool accumulate;     // add to y (a later column panel) instead of storing
};

using PanelKernel = void (*)(const PanelTile&);

// Within a tile of activation rows: bytes from a row's four codes to its next four, and floats
// from a row's step (sum, error) to its next one.
constexpr int kCodeStride = 4 * Q8Rows::kTileRows;
constexpr int kValueStride = Q8Rows::kTileRows;

// Activation row i of a tile: where its four codes of the panel's first columns and its first
// step, sum and error are. Column col's code at codes[kCodeStride * (col / 4) + col % 4], block
// b's step at steps[kValueStride * b]; row i + a of the same tile is a (codes: 4 a) further on.
struct TileRow {
    const int8_t *codes, *residual_codes;
    const float *steps, *residual_steps, *sums, *errors;
    TileRow(const PanelTile& t, int i) {
        const size_t tile = static_cast<size_t>(i / Q8Rows::kTileRows);
        const int r = i % Q8Rows::kTileRows;
        codes = t.codes + tile * t.tile_codes + 4 * r;
        residual_codes = t.residual_codes ? t.residual_codes + tile * t.tile_codes + 4 * r : nullptr;
        steps = t.steps + tile * t.tile_steps + r;
        residual_steps = t.residual_steps ? t.residual_steps + tile * t.tile_steps + r : nullptr;
        sums = t.sums + tile * t.tile_sums + r;
        errors = t.errors + tile * t.tile_sums + r;
    }
};

// Four consecutive codes as one 32-bit word (the lane a kernel broadcasts).
inline int32_t four_codes(const int8_t* c) {
    int32_t v;
    std::memcpy(&v, c, 4);
    return v;
}

// Calls fn(residual, group) with the tile's form as compile-time constants
// (std::integral_constant<bool, ...>, std::integral_constant<int, 16 or 32>): each SIMD kernel is
// a template over them.
template <class Fn>
void with_form(const PanelTile& t, Fn&& fn) {
    using Twice = std::true_type;
    using Once = std::false_type;
    using G32 = std::integral_constant<int, 32>;
    using G16 = std::integral_constant<int, 16>;
    if (t.group == 32) {
        if (t.residual_codes) fn(Twice{}, G32{});
        else fn(Once{}, G32{});
    } else {
        if (t.residual_codes) fn(Twice{}, G16{});
        else fn(Once{}, G16{});
    }
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
