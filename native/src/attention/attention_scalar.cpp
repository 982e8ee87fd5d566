// Scalar reference kernels: one query row at a time, two passes over the scores, no tricks. The
// SIMD kernels are tested against these, and they run wherever no SIMD set is available.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention_kernels.h"
#include "mnn_h2o/cache/kv_dtype.h"

namespace mnn_h2o {
namespace kernels {

namespace {

// Row `token` of a head's K or V, converted by the element type's reference code (kv_dtype.cpp).
void load_row(const Shape& s, const void* const* blocks, int token, float* dst) {
    const void* block = blocks[token / s.block_tokens];
    const size_t offset = static_cast<size_t>(token % s.block_tokens) * kv_row_bytes(s.dtype, s.head_dim);
    kv_rows_to_f32(s.dtype, static_cast<const uint8_t*>(block) + offset, dst, 1, s.head_dim);
}

// The unnormalised softmax state of one query row over keys [kb, ke), those below `first`
// masked (see DecodeArgs). scratch holds ke - kb scores and one converted row. block_peaks (with
// block_sums) gets each block's largest exp(s_j - m).
void row_partial(const Shape& s, const KvHeadView& kv, const float* q, int kb, int ke, int first, float* scratch,
                 float& m, float& l, float* o, float* block_sums, float* block_peaks) {
    const int hd = s.head_dim, n = ke - kb;
    float* scores = scratch;
    float* row = scratch + n;
    m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
        load_row(s, kv.k_blocks, kb + j, row);
        float dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += q[d] * row[d];
        scores[j] = kb + j < first ? -std::numeric_limits<float>::infinity() : dot * s.scale;
        if (scores[j] > m) m = scores[j];
    }
    l = 0.f;
    std::memset(o, 0, sizeof(float) * hd);
    const size_t n_blocks = static_cast<size_t>((n + s.block_tokens - 1) / s.block_tokens);
    if (block_sums) std::memset(block_sums, 0, sizeof(float) * n_blocks);
    if (block_peaks) std::memset(block_peaks, 0, sizeof(float) * n_blocks);
    for (int j = 0; j < n; ++j) {
        const float p = std::exp(scores[j] - m);
        l += p;
        load_row(s, kv.v_blocks, kb + j, row);
        for (int d = 0; d < hd; ++d) o[d] += p * row[d];
        if (block_sums) block_sums[j / s.block_tokens] += p;
        if (block_peaks && p > block_peaks[j / s.block_tokens]) block_peaks[j / s.block_tokens] = p;
    }
}

size_t decode_scratch_floats(const Shape& s, int /*n_rows*/, int n_keys) {
    return static_cast<size_t>(n_keys) + s.head_dim;
}

void decode(const DecodeArgs& a) {
    for (int r = 0; r < a.n_rows; ++r) {
        row_partial(a.shape, *a.kv, a.q_rows[r], a.key_begin, a.key_end, a.key_first, a.scratch, a.m[r], a.l[r],
                    a.o + static_cast<size_t>(r) * a.shape.head_dim,
                    a.block_sums ? a.block_sums + r * a.block_sums_stride : nullptr,
                    a.block_peaks ? a.block_peaks + r * a.block_sums_stride : nullptr);
    }
}

size_t tile_scratch_floats(const Shape& s, int n_blocks) {
    return static_cast<size_t>(n_blocks) * s.block_tokens + 2 * static_cast<size_t>(s.head_dim) + 2 * static_cast<size_t>(n_blocks);
}

void tile(const TileArgs& a) {
    const Shape& s = a.shape;
    const int hd = s.head_dim;
    int max_limit = 0;
    for (int r = 0; r < a.n_rows; ++r) max_limit = a.limits[r] > max_limit ? a.limits[r] : max_limit;
    const int n_blocks = (max_limit + s.block_tokens - 1) / s.block_tokens;
    float* o = a.scratch + tile_scratch_floats(s, n_blocks) - hd - 2 * n_blocks;
    float* block_sums = o + hd;
    float* block_peaks = block_sums + n_blocks;
    for (int r = 0; r < a.n_rows; ++r) {
        float m, l;
        row_partial(s, *a.kv, a.q_rows[r], 0, a.limits[r], a.starts ? a.starts[r] : 0, a.scratch, m, l, o,
                    a.block_scores ? block_sums : nullptr, a.block_max ? block_peaks : nullptr);
        const float inv_l = 1.f / l;
        for (int d = 0; d < hd; ++d) a.out_rows[r][d] = o[d] * inv_l;
        if (a.block_scores) {
            const int nb = (a.limits[r] + s.block_tokens - 1) / s.block_tokens;
            for (int b = 0; b < nb; ++b) a.block_scores[b] += block_sums[b] * inv_l;
            if (a.window_scores && r >= a.window_first_row)
                for (int b = 0; b < nb; ++b) a.window_scores[b] += block_sums[b] * inv_l;
            if (a.block_max)
                for (int b = 0; b < nb; ++b)
                    if (block_peaks[b] * inv_l > a.block_max[b]) a.block_max[b] = block_peaks[b] * inv_l;
        }
    }
}

// Float types only (attention.cpp converts quantised rows itself): n elements as one row.
void from_f32(KvDtype dtype, const float* src, void* dst, size_t n) {
    kv_rows_from_f32(dtype, src, dst, 1, static_cast<int>(n));
}

void to_f32(KvDtype dtype, const void* src, float* dst, size_t n) {
    kv_rows_to_f32(dtype, src, dst, 1, static_cast<int>(n));
}

void hadamard(float* rows, size_t n_rows, int n, float) { hadamard_rows(rows, n_rows, n); }

}  // namespace

const KernelSet& scalar_kernels() {
    // Small tiles: the scalar path is a reference, and small tiles exercise both the tile and the
    // decode code of the dispatcher at small sizes in tests.
    static const KernelSet set{"scalar", 8, decode_scratch_floats, tile_scratch_floats, decode, tile, from_f32, to_f32,
                               hadamard};
    return set;
}

}  // namespace kernels
}  // namespace mnn_h2o
