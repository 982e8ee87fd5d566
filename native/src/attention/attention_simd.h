// The SIMD attention kernels, written once over a traits class V and instantiated by each ISA
// file (attention_avx2.cpp, attention_avx512.cpp, attention_avx512vnni.cpp,
// attention_avx512bf16.cpp, attention_neon.cpp) with its own traits.
//
// Every function here is a template on V, and each ISA file declares its traits in an anonymous
// namespace, so every instantiation has internal linkage: the linker can never swap an AVX-512
// body into an AVX2 caller. For the same reason nothing here calls into the standard library.
//
// V provides: kName (the set's name), vec, W (lanes), kDecodeRows (query rows per pass over a key block in decode),
// kTileKeys (keys per score micro-tile in prefill), kPvCols (value columns per P*V micro-tile in prefill), and
// zero/set1/load/store/add/sub/mul/fmadd/max/hsum/hmax/reduce4/round/pow2n/select_lt,
// butterfly<L> (one Hadamard stage of span L < W inside a vector: lane i becomes x[i] + x[i ^ L]
// where i & L is 0, else x[i ^ L] - x[i]), load_f16/load_bf16/store_f16/store_bf16, load_i8
// (W int8 -> fp32), load_u4 (W 4-bit codes from W/2 bytes, element 2i in the low nibble, -> fp32
// in [0, 15]) and half (one fp16 -> fp32). The quantised loads read exactly W or W/2 bytes: a
// row's last codes sit right before its scales.
// kInt8Scores says whether V also has the int8 dot products of tile_scores_q8 (ivec, iload,
// iload32, ibroadcast4, idot, to_float), kBf16Values whether it has the bf16 ones of
// tile_pv_pairs (pvec, pair, pload, pstore, pdot; only with kInt8Scores).
//
// Includers provide <cstddef>, <cstdint>, the intrinsics header and attention_kernels.h.
#pragma once

#include "../runtime/exp_polynomial.h"

namespace mnn_h2o {
namespace kernels {
namespace simd {

template <class V>
using Vec = typename V::vec;

template <class V>
constexpr float kNegInf = -__builtin_inff();

// exp(x) for x <= 88, within about 2 ulp (Cephes expf polynomial after range reduction by ln 2).
// x below -87.3 (where exp underflows to subnormals) gives exactly 0, so masked scores of -inf
// carry no probability at all.
template <class V>
inline Vec<V> vexp(Vec<V> x) {
    namespace e = exp_polynomial;
    const Vec<V> lo = V::set1(e::kLowest);
    const Vec<V> xc = V::max(x, lo);
    const Vec<V> n = V::round(V::mul(xc, V::set1(e::kLog2e)));
    Vec<V> r = V::fmadd(n, V::set1(-e::kLn2High), xc);
    r = V::fmadd(n, V::set1(e::kLn2Low), r);
    Vec<V> p = V::set1(e::kP[0]);
    for (int i = 1; i < 6; ++i) p = V::fmadd(p, r, V::set1(e::kP[i]));
    const Vec<V> y = V::fmadd(V::mul(p, r), r, V::add(r, V::set1(1.f)));
    return V::select_lt(x, lo, V::zero(), V::mul(y, V::pow2n(n)));
}

// Elements [i, i + W) of a float-type array.
template <class V, KvDtype DT>
inline Vec<V> load_elems(const void* base, size_t i) {
    if constexpr (DT == KvDtype::F32) return V::load(static_cast<const float*>(base) + i);
    else if constexpr (DT == KvDtype::F16) return V::load_f16(static_cast<const uint16_t*>(base) + i);
    else return V::load_bf16(static_cast<const uint16_t*>(base) + i);
}

// Quantised rows (kv_dtype.h): codes, then one fp16 scale per 32 elements.
template <KvDtype DT>
constexpr bool kQuantised = DT == KvDtype::Q8 || DT == KvDtype::Q4;

template <KvDtype DT>
inline size_t code_bytes(int hd) {
    return DT == KvDtype::Q8 ? static_cast<size_t>(hd) : static_cast<size_t>(hd) / 2;
}

template <KvDtype DT>
inline const uint8_t* quant_row(const void* blk, int j, int hd) {
    return static_cast<const uint8_t*>(blk) + static_cast<size_t>(j) * (code_bytes<DT>(hd) + hd / 16);
}

// The scale of the group of element c in row j (quantised types).
template <class V, KvDtype DT>
inline float group_scale(const void* blk, int j, int hd, int c) {
    uint16_t bits;
    __builtin_memcpy(&bits, quant_row<DT>(blk, j, hd) + code_bytes<DT>(hd) + (c / 32) * 2, sizeof bits);
    return V::half(bits);
}

// Elements [c, c + W) of row j of a block as fp32, without the group scale for quantised types
// (the codes, q4's offset of 8 removed); float types need nothing more. W divides 32, so the W
// elements share one scale, and code * scale is the product the scalar reference computes.
template <class V, KvDtype DT>
inline Vec<V> load_unscaled(const void* blk, int j, int hd, int c) {
    if constexpr (DT == KvDtype::Q8) return V::load_i8(reinterpret_cast<const int8_t*>(quant_row<DT>(blk, j, hd)) + c);
    else if constexpr (DT == KvDtype::Q4) return V::sub(V::load_u4(quant_row<DT>(blk, j, hd) + c / 2), V::set1(8.f));
    else return load_elems<V, DT>(blk, static_cast<size_t>(j) * hd + c);
}

// Elements [c, c + W) of row j as fp32, scale applied.
template <class V, KvDtype DT>
inline Vec<V> load_kv(const void* blk, int j, int hd, int c) {
    if constexpr (kQuantised<DT>) return V::mul(load_unscaled<V, DT>(blk, j, hd, c), V::set1(group_scale<V, DT>(blk, j, hd, c)));
    else return load_elems<V, DT>(blk, static_cast<size_t>(j) * hd + c);
}

// The decode loops below convert a group's scale once per row and group, not once per vector.
constexpr int kMaxGroups = 256 / 32;

template <class V>
inline size_t round_up_w(size_t n) {
    return (n + V::W - 1) / V::W * V::W;
}

template <class V>
inline int imin(int a, int b) {
    return a < b ? a : b;
}

// ---------------------------------------------------------------------------------------------
// Decode: few query rows. Each key row is loaded once and dotted with the RC rows of the group
// that share it; four keys at a time so the horizontal sums are done four-wide (reduce4).

template <class V, KvDtype DT, int RC>
void qk_block(const float* q, const void* kblk, int nk, int hd, float* s, size_t s_stride) {
    int j = 0;
    float scales[4][kMaxGroups];
    for (; j + 4 <= nk; j += 4) {
        Vec<V> acc[4][RC];
        for (int jj = 0; jj < 4; ++jj)
            for (int r = 0; r < RC; ++r) acc[jj][r] = V::zero();
        if constexpr (kQuantised<DT>)
            for (int jj = 0; jj < 4; ++jj)
                for (int g = 0; g < hd / 32; ++g) scales[jj][g] = group_scale<V, DT>(kblk, j + jj, hd, g * 32);
        for (int c = 0; c < hd; c += V::W) {
            Vec<V> qv[RC];
            for (int r = 0; r < RC; ++r) qv[r] = V::load(q + r * hd + c);
            for (int jj = 0; jj < 4; ++jj) {
                Vec<V> kv = load_unscaled<V, DT>(kblk, j + jj, hd, c);
                if constexpr (kQuantised<DT>) kv = V::mul(kv, V::set1(scales[jj][c / 32]));
                for (int r = 0; r < RC; ++r) acc[jj][r] = V::fmadd(kv, qv[r], acc[jj][r]);
            }
        }
        for (int r = 0; r < RC; ++r) V::reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r], s + r * s_stride + j);
    }
    for (; j < nk; ++j) {
        Vec<V> acc[RC];
        for (int r = 0; r < RC; ++r) acc[r] = V::zero();
        for (int c = 0; c < hd; c += V::W) {
            const Vec<V> kv = load_kv<V, DT>(kblk, j, hd, c);
            for (int r = 0; r < RC; ++r) acc[r] = V::fmadd(kv, V::load(q + r * hd + c), acc[r]);
        }
        for (int r = 0; r < RC; ++r) s[r * s_stride + j] = V::hsum(acc[r]);
    }
}

// o[r][c0 .. c0 + DC*W) += sum_j p[r][j] * v_j[c0 ..], p rows with stride p_stride.
template <class V, KvDtype DT, int RC, int DC>
void pv_block(const float* p, size_t p_stride, const void* vblk, int nk, int hd, int c0, float* o) {
    Vec<V> acc[RC][DC];
    for (int r = 0; r < RC; ++r)
        for (int d = 0; d < DC; ++d) acc[r][d] = V::load(o + r * hd + c0 + d * V::W);
    for (int j = 0; j < nk; ++j) {
        Vec<V> v[DC];
        if constexpr (kQuantised<DT>) {
            // c0 is a multiple of 4 W: the DC vectors span one group, or two when W is 16.
            const Vec<V> s0 = V::set1(group_scale<V, DT>(vblk, j, hd, c0));
            const Vec<V> s1 = DC * V::W > 32 ? V::set1(group_scale<V, DT>(vblk, j, hd, c0 + 32)) : s0;
            for (int d = 0; d < DC; ++d)
                v[d] = V::mul(load_unscaled<V, DT>(vblk, j, hd, c0 + d * V::W), d * V::W < 32 ? s0 : s1);
        } else {
            for (int d = 0; d < DC; ++d) v[d] = load_elems<V, DT>(vblk, static_cast<size_t>(j) * hd + c0 + d * V::W);
        }
        for (int r = 0; r < RC; ++r) {
            const Vec<V> pr = V::set1(p[r * p_stride + j]);
            for (int d = 0; d < DC; ++d) acc[r][d] = V::fmadd(pr, v[d], acc[r][d]);
        }
    }
    for (int r = 0; r < RC; ++r)
        for (int d = 0; d < DC; ++d) V::store(o + r * hd + c0 + d * V::W, acc[r][d]);
}

template <class V, KvDtype DT, int RC>
void pv_rows(const float* p, size_t p_stride, const void* vblk, int nk, int hd, float* o) {
    for (int c0 = 0; c0 < hd; c0 += 4 * V::W) {
        switch (imin<V>(4, (hd - c0) / V::W)) {
            case 1: pv_block<V, DT, RC, 1>(p, p_stride, vblk, nk, hd, c0, o); break;
            case 2: pv_block<V, DT, RC, 2>(p, p_stride, vblk, nk, hd, c0, o); break;
            case 3: pv_block<V, DT, RC, 3>(p, p_stride, vblk, nk, hd, c0, o); break;
            default: pv_block<V, DT, RC, 4>(p, p_stride, vblk, nk, hd, c0, o); break;
        }
    }
}

// The row counts 1 .. V::kDecodeRows, each its own instantiation (the accumulators in registers).
template <class V, KvDtype DT, int RC = V::kDecodeRows>
void qk_rows(int rc, const float* q, const void* kblk, int nk, int hd, float* s, size_t s_stride) {
    if constexpr (RC > 1)
        if (rc < RC) return qk_rows<V, DT, RC - 1>(rc, q, kblk, nk, hd, s, s_stride);
    qk_block<V, DT, RC>(q, kblk, nk, hd, s, s_stride);
}

template <class V, KvDtype DT, int RC = V::kDecodeRows>
void pv_rows_n(int rc, const float* p, size_t p_stride, const void* vblk, int nk, int hd, float* o) {
    if constexpr (RC > 1)
        if (rc < RC) return pv_rows_n<V, DT, RC - 1>(rc, p, p_stride, vblk, nk, hd, o);
    pv_rows<V, DT, RC>(p, p_stride, vblk, nk, hd, o);
}

// Query rows per pass over the keys: as few passes as kDecodeRows allows, the rows spread evenly
// over them (a group of 8 with kDecodeRows 6 makes two passes of 4, not 6 and 2), since each pass
// converts every key and value row again.
template <class V>
int decode_pass_rows(int n_rows) {
    const int passes = (n_rows + V::kDecodeRows - 1) / V::kDecodeRows;
    return (n_rows + passes - 1) / passes;
}

template <class V>
size_t decode_scratch_floats(const Shape& s, int n_rows, int n_keys) {
    return static_cast<size_t>(n_rows) * (s.head_dim + round_up_w<V>(static_cast<size_t>(n_keys)));
}

template <class V, KvDtype DT>
void decode_impl(const DecodeArgs& a) {
    const Shape& s = a.shape;
    const int hd = s.head_dim, bt = s.block_tokens, n = a.key_end - a.key_begin;
    const size_t stride = round_up_w<V>(static_cast<size_t>(n));
    float* q = a.scratch;
    float* scores = a.scratch + static_cast<size_t>(a.n_rows) * hd;
    const Vec<V> scale = V::set1(s.scale);
    const int pass_rows = decode_pass_rows<V>(a.n_rows);
    for (int r = 0; r < a.n_rows; ++r)
        for (int c = 0; c < hd; c += V::W) V::store(q + r * hd + c, V::mul(V::load(a.q_rows[r] + c), scale));

    // Scores, block by block; all rows of the group reuse each key row while it is in L1.
    for (int k0 = a.key_begin; k0 < a.key_end; k0 += bt) {
        const void* kblk = a.kv->k_blocks[k0 / bt];
        const int nk = imin<V>(bt, a.key_end - k0);
        for (int r0 = 0; r0 < a.n_rows; r0 += pass_rows)
            qk_rows<V, DT>(imin<V>(pass_rows, a.n_rows - r0), q + r0 * hd, kblk, nk, hd,
                           scores + r0 * stride + (k0 - a.key_begin), stride);
    }

    // Softmax numerators in place. The row is padded to whole vectors with -inf (exp -> 0), and
    // block_tokens is a multiple of 16, so each vector lies inside one block. A sliding window's
    // keys before key_first are -inf too.
    for (int r = 0; r < a.n_rows; ++r) {
        float* row = scores + r * stride;
        for (size_t j = static_cast<size_t>(n); j < stride; ++j) row[j] = kNegInf<V>;
        for (int j = 0; j < a.key_first - a.key_begin; ++j) row[j] = kNegInf<V>;
        Vec<V> mv = V::set1(kNegInf<V>);
        for (size_t j = 0; j < stride; j += V::W) mv = V::max(mv, V::load(row + j));
        const float m = V::hmax(mv);
        const Vec<V> mb = V::set1(m);
        Vec<V> total = V::zero();
        for (size_t b0 = 0; b0 < stride; b0 += bt) {
            const size_t b1 = b0 + bt < stride ? b0 + bt : stride;
            Vec<V> block = V::zero(), peak = V::zero();
            for (size_t j = b0; j < b1; j += V::W) {
                const Vec<V> p = vexp<V>(V::sub(V::load(row + j), mb));
                V::store(row + j, p);
                block = V::add(block, p);
                peak = V::max(peak, p);
            }
            if (a.block_sums) a.block_sums[r * a.block_sums_stride + b0 / bt] = V::hsum(block);
            if (a.block_peaks) a.block_peaks[r * a.block_sums_stride + b0 / bt] = V::hmax(peak);
            total = V::add(total, block);
        }
        a.m[r] = m;
        a.l[r] = V::hsum(total);
        for (int c = 0; c < hd; c += V::W) V::store(a.o + static_cast<size_t>(r) * hd + c, V::zero());
    }

    // Weighted values, again block by block with all rows sharing each value row.
    for (int k0 = a.key_begin; k0 < a.key_end; k0 += bt) {
        const void* vblk = a.kv->v_blocks[k0 / bt];
        const int nk = imin<V>(bt, a.key_end - k0);
        for (int r0 = 0; r0 < a.n_rows; r0 += pass_rows)
            pv_rows_n<V, DT>(imin<V>(pass_rows, a.n_rows - r0), scores + r0 * stride + (k0 - a.key_begin), stride,
                             vblk, nk, hd, a.o + static_cast<size_t>(r0) * hd);
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill tile: R = 2*W query rows of one kv head against its keys, a step of a few cache blocks
// at a time (online softmax across steps). Queries are stored transposed (qt[d][r]) so the scores
// of one key for all R rows come out as two vectors without horizontal sums: a small GEMM
// micro-kernel with the key element broadcast. Each converted key/value row then serves all R rows.
// A step spans kTileStepKeys keys, not one 16-token block: the P x V accumulators (R x head_dim
// floats) are loaded, rescaled and stored once a step, which at one block a step took about a
// third of P x V's time (perf, the 1.5B's shape).

template <class V>
constexpr int kTileRows = 2 * V::W;

constexpr int kTileStepKeys = 64;

// Cache blocks per online-softmax step (a template on V like everything here: internal linkage).
template <class V>
int tile_step_blocks(int block_tokens) {
    return block_tokens >= kTileStepKeys ? 1 : kTileStepKeys / block_tokens;
}

template <class V>
size_t tile_scratch_floats(const Shape& s, int n_blocks) {
    constexpr size_t R = kTileRows<V>;
    const size_t hd = s.head_dim, keys = static_cast<size_t>(tile_step_blocks<V>(s.block_tokens)) * s.block_tokens;
    return hd * R + 2 * keys * hd + keys * R + R * hd + 5 * R + 3 * static_cast<size_t>(n_blocks) * R;
}

// st[j][0..R) = sum_d kf[j][d] * qt[d][0..R) for j in [0, nk).
template <class V, int KJ>
void tile_scores(const float* qt, const float* kf, int nk, int hd, float* st) {
    constexpr int R = kTileRows<V>;
    int j = 0;
    for (; j + KJ <= nk; j += KJ) {
        Vec<V> acc0[KJ], acc1[KJ];
        for (int jj = 0; jj < KJ; ++jj) acc0[jj] = acc1[jj] = V::zero();
        for (int d = 0; d < hd; ++d) {
            const Vec<V> q0 = V::load(qt + d * R), q1 = V::load(qt + d * R + V::W);
            for (int jj = 0; jj < KJ; ++jj) {
                const Vec<V> k = V::set1(kf[(j + jj) * hd + d]);
                acc0[jj] = V::fmadd(k, q0, acc0[jj]);
                acc1[jj] = V::fmadd(k, q1, acc1[jj]);
            }
        }
        for (int jj = 0; jj < KJ; ++jj) {
            V::store(st + (j + jj) * R, acc0[jj]);
            V::store(st + (j + jj) * R + V::W, acc1[jj]);
        }
    }
    for (; j < nk; ++j) {
        Vec<V> acc0 = V::zero(), acc1 = V::zero();
        for (int d = 0; d < hd; ++d) {
            const Vec<V> k = V::set1(kf[j * hd + d]);
            acc0 = V::fmadd(k, V::load(qt + d * R), acc0);
            acc1 = V::fmadd(k, V::load(qt + d * R + V::W), acc1);
        }
        V::store(st + j * R, acc0);
        V::store(st + j * R + V::W, acc1);
    }
}

// The P x V micro-kernels' accumulators: columns [c0, c0 + KC) of the transposed output ot, two
// row vectors each, loaded rescaled by the step's alpha and stored back.
template <class V, int KC>
inline void pv_accumulators_load(const float* ot, const float* alpha, int c0, Vec<V>* acc0, Vec<V>* acc1) {
    constexpr int R = kTileRows<V>;
    const Vec<V> a0 = V::load(alpha), a1 = V::load(alpha + V::W);
    for (int c = 0; c < KC; ++c) {
        acc0[c] = V::mul(V::load(ot + (c0 + c) * R), a0);
        acc1[c] = V::mul(V::load(ot + (c0 + c) * R + V::W), a1);
    }
}

template <class V, int KC>
inline void pv_accumulators_store(const Vec<V>* acc0, const Vec<V>* acc1, int c0, float* ot) {
    constexpr int R = kTileRows<V>;
    for (int c = 0; c < KC; ++c) {
        V::store(ot + (c0 + c) * R, acc0[c]);
        V::store(ot + (c0 + c) * R + V::W, acc1[c]);
    }
}

// ot[c][0..R) = ot[c][..] * alpha[0..R) + sum_j vf[j][c] * pt[j][0..R) for c in [c0, c0 + KC): the
// output held transposed, so that a key's probabilities for all R rows are two vector loads and
// each value element one broadcast (tile_scores' micro-kernel again): V is read once a step and
// the probabilities (R floats a key) stay in L1.
template <class V, int KC>
void tile_pv_cols(const float* pt, const float* alpha, const float* vf, int nk, int hd, int c0, float* ot) {
    constexpr int R = kTileRows<V>;
    Vec<V> acc0[KC], acc1[KC];
    pv_accumulators_load<V, KC>(ot, alpha, c0, acc0, acc1);
    for (int j = 0; j < nk; ++j) {
        const Vec<V> p0 = V::load(pt + j * R), p1 = V::load(pt + j * R + V::W);
        for (int c = 0; c < KC; ++c) {
            const Vec<V> v = V::set1(vf[j * hd + c0 + c]);
            acc0[c] = V::fmadd(p0, v, acc0[c]);
            acc1[c] = V::fmadd(p1, v, acc1[c]);
        }
    }
    pv_accumulators_store<V, KC>(acc0, acc1, c0, ot);
}

// ---- A q8 cache's Q x K^T as int8 products (traits with kInt8Scores: AVX-512 VNNI) -------------
// The queries arrive rounded to q8 rows (attention.h), so a score is
//   scale * sum over groups g of dq_g * dk_g * (sum over the group's 32 codes of cq * ck)
// with exact integer inner sums: the float part is one multiply-add per group, key and row vector
// where the float kernel does 32. vpdpbusd multiplies unsigned by signed bytes, so the keys' codes
// are copied with 128 added (ck ^ 0x80) and each row's surplus, 128 x its group's code sum, is
// taken off by starting the accumulator at minus that. The float path reads the same rounded
// queries; the two differ by float rounding only.

constexpr int kQ8Group = 32;  // codes per fp16 scale in a q8 row (kv_dtype.h)

// The tile's queries as qi[g][t][r][4] (group g, its t-th 4 codes, row r: one vector load gives W
// rows' 4 codes), their scales times the softmax scale as qs[g][r] and the offsets qc[g][r] =
// -128 x the sum of row r's codes in group g. Padding rows are zero everywhere.
template <class V>
void pack_queries_q8(const TileArgs& a, int hd, float scale, int8_t* qi, float* qs, int32_t* qc) {
    constexpr int R = kTileRows<V>, T = kQ8Group / 4;
    const int G = hd / kQ8Group;
    for (int r = 0; r < R; ++r) {
        const uint8_t* row = r < a.n_rows ? a.q8_rows[r] : nullptr;
        for (int g = 0; g < G; ++g) {
            int32_t sum = 0;
            float dq = 0.f;
            if (row) {
                for (int c = g * kQ8Group; c < (g + 1) * kQ8Group; ++c) sum += static_cast<int8_t>(row[c]);
                uint16_t bits;
                __builtin_memcpy(&bits, row + hd + 2 * g, sizeof bits);
                dq = V::half(bits) * scale;
            }
            for (int t = 0; t < T; ++t) {
                int8_t* dst = qi + (static_cast<size_t>(g * T + t) * R + r) * 4;
                if (row) __builtin_memcpy(dst, row + g * kQ8Group + t * 4, 4);
                else __builtin_memset(dst, 0, 4);
            }
            qs[g * R + r] = dq;
            const int32_t offset = -128 * sum;
            __builtin_memcpy(qc + g * R + r, &offset, sizeof offset);
        }
    }
}

// nk keys of a q8 block: codes + 128 into ku[j][hd], scales into ks[j][G].
template <class V>
void pack_keys_q8(const void* blk, int nk, int hd, uint8_t* ku, float* ks) {
    const int G = hd / kQ8Group;
    for (int j = 0; j < nk; ++j) {
        const uint8_t* row = quant_row<KvDtype::Q8>(blk, j, hd);
        for (int c = 0; c < hd; c += 8) {
            uint64_t x;
            __builtin_memcpy(&x, row + c, sizeof x);
            x ^= 0x8080808080808080ull;
            __builtin_memcpy(ku + static_cast<size_t>(j) * hd + c, &x, sizeof x);
        }
        for (int g = 0; g < G; ++g) ks[j * G + g] = group_scale<V, KvDtype::Q8>(blk, j, hd, g * kQ8Group);
    }
}

// st[j][0..R) for keys [j, j + KJ): tile_scores' micro-kernel with 4 codes a broadcast.
template <class V, int KJ>
void q8_scores_at(const int8_t* qi, const float* qs, const int32_t* qc, const uint8_t* ku, const float* ks, int hd,
                  int j, float* st) {
    using IVec = typename V::ivec;
    constexpr int R = kTileRows<V>, W = V::W, T = kQ8Group / 4;
    const int G = hd / kQ8Group;
    for (int g = 0; g < G; ++g) {
        IVec acc0[KJ], acc1[KJ];
        const IVec c0 = V::iload32(qc + g * R), c1 = V::iload32(qc + g * R + W);
        for (int jj = 0; jj < KJ; ++jj) {
            acc0[jj] = c0;
            acc1[jj] = c1;
        }
        const int8_t* qg = qi + static_cast<size_t>(g) * T * R * 4;
        const uint8_t* kg = ku + static_cast<size_t>(j) * hd + g * kQ8Group;
        for (int t = 0; t < T; ++t) {
            const IVec q0 = V::iload(qg + t * R * 4), q1 = V::iload(qg + t * R * 4 + W * 4);
            for (int jj = 0; jj < KJ; ++jj) {
                const IVec k = V::ibroadcast4(kg + static_cast<size_t>(jj) * hd + t * 4);
                acc0[jj] = V::idot(acc0[jj], k, q0);
                acc1[jj] = V::idot(acc1[jj], k, q1);
            }
        }
        const Vec<V> s0 = V::load(qs + g * R), s1 = V::load(qs + g * R + W);
        for (int jj = 0; jj < KJ; ++jj) {
            const Vec<V> dk = V::set1(ks[static_cast<size_t>(j + jj) * G + g]);
            float* out = st + static_cast<size_t>(j + jj) * R;
            const Vec<V> f0 = V::mul(s0, dk), f1 = V::mul(s1, dk);
            if (g == 0) {
                V::store(out, V::mul(V::to_float(acc0[jj]), f0));
                V::store(out + W, V::mul(V::to_float(acc1[jj]), f1));
            } else {
                V::store(out, V::fmadd(V::to_float(acc0[jj]), f0, V::load(out)));
                V::store(out + W, V::fmadd(V::to_float(acc1[jj]), f1, V::load(out + W)));
            }
        }
    }
}

template <class V>
void tile_scores_q8(const int8_t* qi, const float* qs, const int32_t* qc, const uint8_t* ku, const float* ks, int nk,
                    int hd, float* st) {
    int j = 0;
    for (; j + V::kTileKeys <= nk; j += V::kTileKeys) q8_scores_at<V, V::kTileKeys>(qi, qs, qc, ku, ks, hd, j, st);
    for (; j < nk; ++j) q8_scores_at<V, 1>(qi, qs, qc, ku, ks, hd, j, st);
}

// ---- A q8 cache's P x V as bf16 products (traits with kBf16Values: AVX-512 BF16) -------------
// Each key pair (j, j + 1) of a step is one 32-bit lane, and vdpbf16ps takes both keys in one
// instruction where the float kernel takes one key in one FMA. The probabilities and the values
// (code x scale) are rounded to bf16 (8 significant bits: up to 2^-8 of each, and a row's largest
// probability, 1, exactly); sums and the softmax's normaliser stay fp32. On random rows the
// output moves by about 2e-3 of its size, where the q8 rows' own rounding moves it by about 4e-3;
// folding each value's scale into its probability instead (the codes exact) measured the same.

// vb[jp][c] = column c of the values of keys k0 + 2jp and k0 + 2jp + 1 as a pair (an odd last
// key pairs with 0).
template <class V, KvDtype DT>
void pack_values_pairs(const KvHeadView* kv, int k0, int nk, int bt, int hd, uint32_t* vb) {
    for (int j = 0; j < nk; j += 2) {
        const int ka = k0 + j, kb = ka + 1;
        const void* blk_a = kv->v_blocks[ka / bt];
        const void* blk_b = j + 1 < nk ? kv->v_blocks[kb / bt] : nullptr;
        for (int c = 0; c < hd; c += V::W) {
            const Vec<V> a = load_kv<V, DT>(blk_a, ka % bt, hd, c);
            const Vec<V> b = blk_b ? load_kv<V, DT>(blk_b, kb % bt, hd, c) : V::zero();
            V::pstore(vb + static_cast<size_t>(j / 2) * hd + c, V::pair(a, b));
        }
    }
}

// pb[jp][0..R) = the probabilities st[2jp][..] and st[2jp + 1][..] as pairs.
template <class V>
void pack_probabilities_pairs(const float* st, int nk, uint32_t* pb) {
    constexpr int R = kTileRows<V>, W = V::W;
    for (int j = 0; j < nk; j += 2) {
        const bool has_b = j + 1 < nk;
        for (int h = 0; h < R; h += W) {
            const Vec<V> a = V::load(st + j * R + h);
            const Vec<V> b = has_b ? V::load(st + (j + 1) * R + h) : V::zero();
            V::pstore(pb + (j / 2) * R + h, V::pair(a, b));
        }
    }
}

// tile_pv_cols over key pairs: ot[c][0..R) = ot[c][..] * alpha + sum over pairs jp of
// pb[jp][..] . vb[jp][c], for c in [c0, c0 + KC).
template <class V, int KC>
void tile_pv_pairs(const uint32_t* pb, const float* alpha, const uint32_t* vb, int n_pairs, int hd, int c0,
                   float* ot) {
    constexpr int R = kTileRows<V>;
    Vec<V> acc0[KC], acc1[KC];
    pv_accumulators_load<V, KC>(ot, alpha, c0, acc0, acc1);
    for (int jp = 0; jp < n_pairs; ++jp) {
        const typename V::pvec p0 = V::pload(pb + jp * R), p1 = V::pload(pb + jp * R + V::W);
        const uint32_t* v = vb + static_cast<size_t>(jp) * hd + c0;
        for (int c = 0; c < KC; ++c) {
            acc0[c] = V::pdot(acc0[c], p0, v[c]);
            acc1[c] = V::pdot(acc1[c], p1, v[c]);
        }
    }
    pv_accumulators_store<V, KC>(acc0, acc1, c0, ot);
}

template <class V, KvDtype DT>
void convert_block(const void* blk, int nk, int hd, float* dst) {
    for (int j = 0; j < nk; ++j)
        for (int c = 0; c < hd; c += V::W) V::store(dst + static_cast<size_t>(j) * hd + c, load_kv<V, DT>(blk, j, hd, c));
}

template <class V, KvDtype DT>
void tile_impl(const TileArgs& a) {
    constexpr int R = kTileRows<V>, W = V::W, PC = V::kPvCols;
    constexpr bool kQ8Products = DT == KvDtype::Q8 && V::kInt8Scores;
    constexpr bool kBf16Products = kQ8Products && V::kBf16Values;
    const Shape& s = a.shape;
    const int hd = s.head_dim, bt = s.block_tokens;
    int lim_min = a.limits[0], lim_max = a.limits[0];
    for (int r = 1; r < a.n_rows; ++r) {
        lim_min = imin<V>(lim_min, a.limits[r]);
        lim_max = a.limits[r] > lim_max ? a.limits[r] : lim_max;
    }
    // A sliding window: rows see keys from starts[r]; the steps begin at the block of the lowest.
    int start_min = 0, start_max = 0;
    if (a.starts) {
        start_min = start_max = a.starts[0];
        for (int r = 1; r < a.n_rows; ++r) {
            start_min = imin<V>(start_min, a.starts[r]);
            start_max = a.starts[r] > start_max ? a.starts[r] : start_max;
        }
    }
    const int n_blocks = (lim_max + bt - 1) / bt, first_block = start_min / bt;
    const int step_blocks = tile_step_blocks<V>(bt), step_keys = step_blocks * bt;

    float* qt = a.scratch;
    float* kf = qt + hd * R;
    float* vf = kf + static_cast<size_t>(step_keys) * hd;
    float* st = vf + static_cast<size_t>(step_keys) * hd;
    float* o = st + static_cast<size_t>(step_keys) * R;  // transposed: o[c * R + r]
    float* m = o + R * hd;
    float* l = m + R;
    float* alpha = l + R;
    float* limf = alpha + R;
    float* bsum = limf + R;
    float* bmax = bsum + static_cast<size_t>(n_blocks) * R;
    float* bpeak = bmax + static_cast<size_t>(n_blocks) * R;  // each block's own largest (masked) score
    float* startf = bpeak + static_cast<size_t>(n_blocks) * R;
    // The int8 products' operands in the float buffers they replace: qt's hd x R floats hold the
    // packed queries (hd x R bytes, then 2 x hd / 32 x R scales and offsets), kf's the keys.
    int8_t* qi = reinterpret_cast<int8_t*>(qt);
    float* qs = qt + hd * R / 4;
    int32_t* qc = reinterpret_cast<int32_t*>(qs + hd / kQ8Group * R);
    uint8_t* ku = reinterpret_cast<uint8_t*>(kf);
    float* ks = kf + static_cast<size_t>(step_keys) * hd / 4;
    // bf16 P x V: the value pairs in kf's second half (the packed keys and scales fill less than
    // 9/32 of it), the probability pairs in vf (R / 2 of its hd floats a key).
    uint32_t* vb = reinterpret_cast<uint32_t*>(kf + static_cast<size_t>(step_keys) * hd / 2);
    uint32_t* pb = reinterpret_cast<uint32_t*>(vf);

    // Padding rows get zero queries and the widest limit: harmless lanes that are never read.
    if constexpr (kQ8Products) pack_queries_q8<V>(a, hd, s.scale, qi, qs, qc);
    for (int r = 0; r < R; ++r) {
        const bool real = r < a.n_rows;
        if constexpr (!kQ8Products)
            for (int d = 0; d < hd; ++d) qt[d * R + r] = real ? a.q_rows[r][d] * s.scale : 0.f;
        limf[r] = static_cast<float>(real ? a.limits[r] : lim_max);
        startf[r] = static_cast<float>(real && a.starts ? a.starts[r] : start_min);
        m[r] = kNegInf<V>;
        l[r] = 0.f;
    }
    for (int i = 0; i < R * hd; i += W) V::store(o + i, V::zero());

    const Vec<V> lim0 = V::load(limf), lim1 = V::load(limf + W);
    const Vec<V> start0 = V::load(startf), start1 = V::load(startf + W);
    const Vec<V> neg_inf = V::set1(kNegInf<V>);
    for (int b0 = first_block; b0 < n_blocks; b0 += step_blocks) {
        // The step's blocks converted into consecutive rows of kf / vf: keys [k0, k0 + nk).
        const int b1 = imin<V>(n_blocks, b0 + step_blocks);
        const int k0 = b0 * bt;
        const int nk = lim_max - k0 < step_keys ? lim_max - k0 : step_keys;
        for (int b = b0; b < b1; ++b) {
            const int bk = imin<V>(bt, lim_max - b * bt);
            const size_t first = static_cast<size_t>(b - b0) * bt;
            if constexpr (kQ8Products)
                pack_keys_q8<V>(a.kv->k_blocks[b], bk, hd, ku + first * hd, ks + first * (hd / kQ8Group));
            else
                convert_block<V, DT>(a.kv->k_blocks[b], bk, hd, kf + first * hd);
            if constexpr (!kBf16Products) convert_block<V, DT>(a.kv->v_blocks[b], bk, hd, vf + first * hd);
        }
        if constexpr (kBf16Products) pack_values_pairs<V, DT>(a.kv, k0, nk, bt, hd, vb);
        if constexpr (kQ8Products) tile_scores_q8<V>(qi, qs, qc, ku, ks, nk, hd, st);
        else tile_scores<V, V::kTileKeys>(qt, kf, nk, hd, st);

        // Causal mask, only where some row's limit falls inside this step.
        if (k0 + nk > lim_min) {
            for (int j = 0; j < nk; ++j) {
                const Vec<V> key = V::set1(static_cast<float>(k0 + j));
                V::store(st + j * R, V::select_lt(key, lim0, V::load(st + j * R), neg_inf));
                V::store(st + j * R + W, V::select_lt(key, lim1, V::load(st + j * R + W), neg_inf));
            }
        }
        // The window's mask, only where some row's start falls after this step's first key.
        if (k0 < start_max) {
            for (int j = 0; j < nk; ++j) {
                const Vec<V> key = V::set1(static_cast<float>(k0 + j));
                V::store(st + j * R, V::select_lt(key, start0, neg_inf, V::load(st + j * R)));
                V::store(st + j * R + W, V::select_lt(key, start1, neg_inf, V::load(st + j * R + W)));
            }
        }
        // Each block's own largest score (kept for block_max), and the step's.
        Vec<V> ms0 = neg_inf, ms1 = neg_inf;
        for (int b = b0; b < b1; ++b) {
            Vec<V> mb0 = neg_inf, mb1 = neg_inf;
            for (int j = (b - b0) * bt, je = imin<V>(nk, j + bt); j < je; ++j) {
                mb0 = V::max(mb0, V::load(st + j * R));
                mb1 = V::max(mb1, V::load(st + j * R + W));
            }
            if (a.block_max) {
                V::store(bpeak + b * R, mb0);
                V::store(bpeak + b * R + W, mb1);
            }
            ms0 = V::max(ms0, mb0);
            ms1 = V::max(ms1, mb1);
        }
        // Without a window key 0 is visible to every row, so after the first step the running max
        // is finite and m - m_new is never (-inf) - (-inf). In a window a row may see none of a
        // step's keys: its max is then taken as 0 for the subtractions (exp of -inf - 0 is 0).
        const Vec<V> m0 = V::load(m), m1 = V::load(m + W);
        Vec<V> mn0 = V::max(m0, ms0), mn1 = V::max(m1, ms1);
        const Vec<V> mr0 = mn0, mr1 = mn1;  // the true maxima, kept for block_scores
        if (a.starts) {
            const Vec<V> lowest = V::set1(-__FLT_MAX__);
            mn0 = V::select_lt(mn0, lowest, V::zero(), mn0);
            mn1 = V::select_lt(mn1, lowest, V::zero(), mn1);
        }
        const Vec<V> a0 = vexp<V>(V::sub(m0, mn0)), a1 = vexp<V>(V::sub(m1, mn1));
        Vec<V> ls0 = V::zero(), ls1 = V::zero();
        for (int b = b0; b < b1; ++b) {
            Vec<V> bs0 = V::zero(), bs1 = V::zero();
            for (int j = (b - b0) * bt, je = imin<V>(nk, j + bt); j < je; ++j) {
                const Vec<V> p0 = vexp<V>(V::sub(V::load(st + j * R), mn0));
                const Vec<V> p1 = vexp<V>(V::sub(V::load(st + j * R + W), mn1));
                V::store(st + j * R, p0);
                V::store(st + j * R + W, p1);
                bs0 = V::add(bs0, p0);
                bs1 = V::add(bs1, p1);
            }
            if (a.block_scores) {
                V::store(bsum + b * R, bs0);
                V::store(bsum + b * R + W, bs1);
                V::store(bmax + b * R, mr0);
                V::store(bmax + b * R + W, mr1);
            }
            ls0 = V::add(ls0, bs0);
            ls1 = V::add(ls1, bs1);
        }
        V::store(l, V::fmadd(V::load(l), a0, ls0));
        V::store(l + W, V::fmadd(V::load(l + W), a1, ls1));
        V::store(m, mr0);
        V::store(m + W, mr1);
        V::store(alpha, a0);
        V::store(alpha + W, a1);
        int c0 = 0;
        if constexpr (kBf16Products) {
            pack_probabilities_pairs<V>(st, nk, pb);
            const int n_pairs = (nk + 1) / 2;
            for (; c0 + PC <= hd; c0 += PC) tile_pv_pairs<V, PC>(pb, alpha, vb, n_pairs, hd, c0, o);
            for (; c0 < hd; ++c0) tile_pv_pairs<V, 1>(pb, alpha, vb, n_pairs, hd, c0, o);
        } else {
            for (; c0 + PC <= hd; c0 += PC) tile_pv_cols<V, PC>(st, alpha, vf, nk, hd, c0, o);
            for (; c0 < hd; ++c0) tile_pv_cols<V, 1>(st, alpha, vf, nk, hd, c0, o);
        }
    }

    for (int r = 0; r < a.n_rows; ++r) {
        const float inv = 1.f / l[r];
        for (int c = 0; c < hd; ++c) a.out_rows[r][c] = o[c * R + r] * inv;
    }
    if (a.block_scores) {
        // Probability mass of block b for row r: bsum * exp(bmax - m_final) / l_final.
        for (int r = 0; r < R; ++r) alpha[r] = r < a.n_rows ? 1.f / l[r] : 0.f;
        // The window's rows as a 0/1 mask (limf is free now): its masses come out of the same
        // products, so the window costs one multiply-add per block and row.
        for (int r = 0; r < R; ++r) limf[r] = r >= a.window_first_row && r < a.n_rows ? 1.f : 0.f;
        const Vec<V> w0 = V::load(alpha), w1 = V::load(alpha + W);
        const Vec<V> in0 = V::load(limf), in1 = V::load(limf + W);
        const Vec<V> m0 = V::load(m), m1 = V::load(m + W);
        for (int b = 0; b < n_blocks; ++b) {
            const Vec<V> f0 = V::mul(V::mul(V::load(bsum + b * R), vexp<V>(V::sub(V::load(bmax + b * R), m0))), w0);
            const Vec<V> f1 =
                V::mul(V::mul(V::load(bsum + b * R + W), vexp<V>(V::sub(V::load(bmax + b * R + W), m1))), w1);
            a.block_scores[b] += V::hsum(V::add(f0, f1));
            if (a.window_scores) a.window_scores[b] += V::hsum(V::fmadd(f0, in0, V::mul(f1, in1)));
            if (!a.block_max) continue;
            // The block's largest probability per row: exp(peak score - m_final) / l_final (0 for
            // padding rows, whose weight is 0, and for rows that see none of its keys).
            const Vec<V> p0 = V::mul(vexp<V>(V::sub(V::load(bpeak + b * R), m0)), w0);
            const Vec<V> p1 = V::mul(vexp<V>(V::sub(V::load(bpeak + b * R + W), m1)), w1);
            const float peak = V::hmax(V::max(p0, p1));
            if (peak > a.block_max[b]) a.block_max[b] = peak;
        }
    }
}

// ---------------------------------------------------------------------------------------------

template <class V>
void decode(const DecodeArgs& a) {
    switch (a.shape.dtype) {
        case KvDtype::F16: decode_impl<V, KvDtype::F16>(a); break;
        case KvDtype::BF16: decode_impl<V, KvDtype::BF16>(a); break;
        case KvDtype::F32: decode_impl<V, KvDtype::F32>(a); break;
        case KvDtype::Q8: decode_impl<V, KvDtype::Q8>(a); break;
        case KvDtype::Q4: decode_impl<V, KvDtype::Q4>(a); break;
        default: break;  // rotated types arrive as their storage type (attention())
    }
}

template <class V>
void tile(const TileArgs& a) {
    switch (a.shape.dtype) {
        case KvDtype::F16: tile_impl<V, KvDtype::F16>(a); break;
        case KvDtype::BF16: tile_impl<V, KvDtype::BF16>(a); break;
        case KvDtype::F32: tile_impl<V, KvDtype::F32>(a); break;
        case KvDtype::Q8: tile_impl<V, KvDtype::Q8>(a); break;
        case KvDtype::Q4: tile_impl<V, KvDtype::Q4>(a); break;
        default: break;  // rotated types arrive as their storage type (attention())
    }
}

template <class V>
void from_f32(KvDtype dtype, const float* src, void* dst, size_t n) {
    for (size_t i = 0; i < n; i += V::W) {
        const Vec<V> x = V::load(src + i);
        switch (dtype) {
            case KvDtype::F32: V::store(static_cast<float*>(dst) + i, x); break;
            case KvDtype::F16: V::store_f16(static_cast<uint16_t*>(dst) + i, x); break;
            case KvDtype::BF16: V::store_bf16(static_cast<uint16_t*>(dst) + i, x); break;
            default: break;  // quantised rows are converted by the reference code (attention.cpp)
        }
    }
}

template <class V>
void to_f32(KvDtype dtype, const void* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; i += V::W) {
        switch (dtype) {
            case KvDtype::F32: V::store(dst + i, load_elems<V, KvDtype::F32>(src, i)); break;
            case KvDtype::F16: V::store(dst + i, load_elems<V, KvDtype::F16>(src, i)); break;
            case KvDtype::BF16: V::store(dst + i, load_elems<V, KvDtype::BF16>(src, i)); break;
            default: break;
        }
    }
}

// Every in-vector stage of the Hadamard transform, spans L, 2L, ... < W.
template <class V, int L>
inline Vec<V> butterflies(Vec<V> v) {
    if constexpr (L < V::W) return butterflies<V, 2 * L>(V::template butterfly<L>(v));
    else return v;
}

// hadamard_rows's additions in its order: a stage of span len < W pairs lanes inside a vector
// (V::butterfly), a longer one pairs whole vectors; the last stage's sums are scaled as they are
// stored (a product after the sum, as the reference's). Rows shorter than a vector, or not a
// whole number of vectors, take the reference itself.
template <class V>
void hadamard(float* rows, size_t n_rows, int n, float scale) {
    if (n % V::W) {
        hadamard_rows(rows, n_rows, n);
        return;
    }
    const Vec<V> s = V::set1(scale);
    for (size_t r = 0; r < n_rows; ++r) {
        float* x = rows + r * static_cast<size_t>(n);
        const bool last_in_vector = n == V::W;
        for (int i = 0; i < n; i += V::W) {
            const Vec<V> v = butterflies<V, 1>(V::load(x + i));
            V::store(x + i, last_in_vector ? V::mul(v, s) : v);
        }
        for (int len = V::W; len < n; len <<= 1) {
            const bool last = 2 * len == n;
            for (int i = 0; i < n; i += 2 * len)
                for (int j = i; j < i + len; j += V::W) {
                    const Vec<V> a = V::load(x + j), b = V::load(x + j + len);
                    Vec<V> sum = V::add(a, b), diff = V::sub(a, b);
                    if (last) {
                        sum = V::mul(sum, s);
                        diff = V::mul(diff, s);
                    }
                    V::store(x + j, sum);
                    V::store(x + j + len, diff);
                }
        }
    }
}

template <class V>
constexpr KernelSet kernel_set() {
    return KernelSet{V::kName, kTileRows<V>, decode_scratch_floats<V>, tile_scratch_floats<V>, decode<V>,
                     tile<V>,      from_f32<V>,              to_f32<V>,          hadamard<V>};
}

}  // namespace simd
}  // namespace kernels
}  // namespace mnn_h2o
