#include "mnn_h2o/dense/weight_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mnn_h2o/cache/fp16.h"
#include "weight_matrix_kernels.h"

namespace mnn_h2o {

namespace {

float half_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
}

// The integer dot of n values.
template <typename W>
int32_t idot(const W* w, const int8_t* c, int n) {
    int32_t d = 0;
    for (int i = 0; i < n; ++i) d += static_cast<int32_t>(w[i]) * c[i];
    return d;
}

}  // namespace

// Q4_K and Q5_K (the same sub-blocks; Q5_K's fifth bit per value, weight_types.h). The rounding
// errors' part at the codes' centre (q4_matrix.h) joins each sub-block's dot.
template <bool kFifthBit>
static void q45_k_rows_scalar(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
    constexpr float kCentre = kFifthBit ? kQ5KCentre : kQ4KCentre;
    const Q8Activation& x = *p.x;
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float acc = 0.f;
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * kBytes;
            const float d = half_at(b), dmin = half_at(b + 2);
            uint8_t s[8], m[8];
            q4_k_scales_mins(b + 4, s, m);
            const float t = x.super_steps[static_cast<size_t>(k)];
            for (int j = 0; j < 8; ++j) {
                uint8_t n[32];
                const uint8_t* q = b + kQs + 32 * (j / 2);
                for (int l = 0; l < 32; ++l) {
                    n[l] = (j % 2) ? (q[l] >> 4) : (q[l] & 15);
                    if (kFifthBit) n[l] = static_cast<uint8_t>(n[l] + 16 * ((b[16 + l] >> j) & 1));
                }
                const size_t blk = static_cast<size_t>(8 * k + j);
                const float dot = t * x.multipliers[blk] * static_cast<float>(idot(n, x.seq_codes.data() + blk * 32, 32)) +
                                  kCentre * x.rounding_errors[blk];
                acc += d * static_cast<float>(s[j]) * dot - dmin * static_cast<float>(m[j]) * x.sums[blk];
            }
        }
        p.y[r - r0] = acc;
    }
}

void q4_k_rows_scalar(const BlockRows& p, int r0, int r1) { q45_k_rows_scalar<false>(p, r0, r1); }
void q5_k_rows_scalar(const BlockRows& p, int r0, int r1) { q45_k_rows_scalar<true>(p, r0, r1); }

// Q6_K: its offset of 32 against the rounded sums, so the dot is that of (q - 32) and the codes.
void q6_k_rows_scalar(const BlockRows& p, int r0, int r1) {
    const Q8Activation& x = *p.x;
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float acc = 0.f;
        for (int k = 0; k < p.cols / 256; ++k) {
            const uint8_t* b = row + static_cast<size_t>(k) * 210;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const float d = half_at(b + 208);
            const float t = x.super_steps[static_cast<size_t>(k)];
            uint8_t q[256];
            q6_k_values(b, q);
            for (int j = 0; j < 16; ++j) {
                const size_t blk = static_cast<size_t>(8 * k + j / 2), g = static_cast<size_t>(16 * k + j);
                const float dot = t * x.multipliers[blk] * static_cast<float>(idot(q + 16 * j, x.seq_codes.data() + g * 16, 16)) -
                                  32.f * x.rounded_sums16[g];
                acc += d * static_cast<float>(sc[j]) * dot;
            }
        }
        p.y[r - r0] = acc;
    }
}

// Q5_0 and Q8_0: signed codes w (Q5_0: n - 16) and one scale d per block of 32, on the
// activation's first rounding in its pair form (q4_matrix.h: per block of 32 its own step, for
// any width): y = sum over blocks b of d_b scales[b] dot(w_b, codes_b). One rounding is enough
// here, as llama.cpp's q8_0 activations are: the codes are centred on 0 (Q5_0's mean -0.5), so the
// rounding errors meet them without the offset that makes k-quant and Q4 products need more.
template <bool kQ5>
static void signed_rows_scalar(const BlockRows& p, int r0, int r1) {
    constexpr int kBytes = kQ5 ? 22 : 34;
    const Q8Activation& x = *p.x;
    for (int r = r0; r < r1; ++r) {
        const uint8_t* row = p.blocks + static_cast<size_t>(r) * p.row_bytes;
        float acc = 0.f;
        for (int b = 0; b < p.cols / 32; ++b) {
            const uint8_t* blk = row + static_cast<size_t>(b) * kBytes;
            int8_t w[32];
            if (kQ5) q5_0_values(blk, w);
            else std::memcpy(w, blk + 2, 32);
            const int8_t* c = pair_codes(x, b);
            const int32_t dot = idot(w, c, 16) + idot(w + 16, c + 32, 16);
            acc += half_at(blk) * x.scales[static_cast<size_t>(b)] * static_cast<float>(dot);
        }
        p.y[r - r0] = acc;
    }
}

void q5_0_rows_scalar(const BlockRows& p, int r0, int r1) { signed_rows_scalar<true>(p, r0, r1); }
void q8_0_rows_scalar(const BlockRows& p, int r0, int r1) { signed_rows_scalar<false>(p, r0, r1); }

namespace {

// The row kernels of each type held as GGUF blocks (HeldAs::GgufBlocks), per ISA: scalar (the
// reference), AVX2 (x86), AVX-512 VNNI (where written: the k-quants; AVX-512 machines run the AVX2
// kernel of a type without one), NEON (aarch64), and the activation form they read (q4_matrix.h):
// the k-quant form, or the pair form's first rounding.
struct RowKernels {
    WeightType type;
    bool kquant_form;
    BlockRowsKernel scalar, avx2, avx512vnni, neon;
};

// A kernel compiled only for its ISA's builds; elsewhere its slot is empty and never chosen.
#if defined(MNN_H2O_HAVE_X86_KERNELS)
#define MNN_H2O_X86(f) f
#else
#define MNN_H2O_X86(f) nullptr
#endif
#if defined(__aarch64__)
#define MNN_H2O_NEON(f) f
#else
#define MNN_H2O_NEON(f) nullptr
#endif
const RowKernels kRowKernels[] = {
    {WeightType::Q5_0, false, q5_0_rows_scalar, MNN_H2O_X86(q5_0_rows_avx2), nullptr, MNN_H2O_NEON(q5_0_rows_neon)},
    {WeightType::Q8_0, false, q8_0_rows_scalar, MNN_H2O_X86(q8_0_rows_avx2), nullptr, MNN_H2O_NEON(q8_0_rows_neon)},
    {WeightType::Q4_K, true, q4_k_rows_scalar, MNN_H2O_X86(q4_k_rows_avx2), MNN_H2O_X86(q4_k_rows_avx512vnni),
     MNN_H2O_NEON(q4_k_rows_neon)},
    {WeightType::Q5_K, true, q5_k_rows_scalar, MNN_H2O_X86(q5_k_rows_avx2), MNN_H2O_X86(q5_k_rows_avx512vnni),
     MNN_H2O_NEON(q5_k_rows_neon)},
    {WeightType::Q6_K, true, q6_k_rows_scalar, MNN_H2O_X86(q6_k_rows_avx2), MNN_H2O_X86(q6_k_rows_avx512vnni),
     MNN_H2O_NEON(q6_k_rows_neon)},
};
#undef MNN_H2O_X86
#undef MNN_H2O_NEON

const RowKernels& row_kernels(WeightType type) {
    for (const RowKernels& k : kRowKernels)
        if (k.type == type) return k;
    // The table of types (weight_types.cpp) says GgufBlocks for a type with no row kernels here.
    throw std::logic_error(std::string("WeightMatrix: no row kernels for ") + weight_traits(type).name);
}

}  // namespace

WeightMatrix::WeightMatrix(int cols, const std::vector<Part>& parts) : cols_(cols) {
    if (cols <= 0 || cols % kQ4Block != 0)
        throw std::invalid_argument("WeightMatrix: cols must be a positive multiple of 32, not " + std::to_string(cols));
    if (parts.empty()) throw std::invalid_argument("WeightMatrix: no parts");
    for (size_t pi = 0; pi < parts.size(); ++pi) {
        const Part& part = parts[pi];
        const WeightTypeTraits& t = weight_traits(part.type);
        const std::string what = "WeightMatrix part " + std::to_string(pi) + " (" + t.name + "): ";
        if (part.rows <= 0) throw std::invalid_argument(what + "rows must be positive");
        if (cols % t.block_values != 0)
            throw std::invalid_argument(what + "a row of " + std::to_string(cols) + " values is not a whole number of " +
                                        std::to_string(t.block_values) + "-value blocks");
        const size_t row_bytes = weight_row_bytes(t, cols);
        if (part.bytes != row_bytes * static_cast<size_t>(part.rows))
            throw std::invalid_argument(what + std::to_string(part.bytes) + " bytes for " +
                                        std::to_string(part.rows) + " rows of " + std::to_string(row_bytes));
        if (!part.blocks && !part.fill) throw std::invalid_argument(what + "neither bytes nor a fill");
        // The bytes: the caller's, or filled into the segment's own memory (block pairs are
        // repacked from a transient copy).
        Segment seg{&t, rows_, part.rows, row_bytes, {}, nullptr};
        std::vector<uint8_t> staged;
        const uint8_t* src = part.blocks;
        if (t.held == HeldAs::GgufBlocks) {
            seg.blocks = src ? std::make_shared<const HugePageBytes>(src, part.bytes)
                             : std::make_shared<const HugePageBytes>(part.bytes, part.fill);
            src = seg.blocks->data();
        } else if (!src) {
            staged.resize(part.bytes);
            part.fill(staged.data());
            src = staged.data();
        }
        const size_t n_blocks = part.bytes / static_cast<size_t>(t.block_bytes);
        for (size_t k = 0; k < n_blocks; ++k)
            for (int off : t.half_offsets)
                if (off >= 0 && !std::isfinite(half_at(src + k * t.block_bytes + off)))
                    throw std::invalid_argument(what + "block " + std::to_string(k) + " has a scale that is not finite");
        if (t.held == HeldAs::Q4Pairs) {
            // Q4Matrix's inputs: the nibble bytes as the GGUF packs them, fp16 scale and min per
            // block (Q4_0's (n - 8) d is n d + (-8 d), exact in fp16 but for an overflow, refused).
            const size_t nb = n_blocks;
            std::vector<uint8_t> nibbles(nb * 16);
            std::vector<uint16_t> scales(nb), mins(nb);
            const bool has_min = t.type == WeightType::Q4_1;
            const int qs = has_min ? 4 : 2;
            for (size_t k = 0; k < nb; ++k) {
                const uint8_t* b = src + k * t.block_bytes;
                std::memcpy(&scales[k], b, 2);
                if (has_min) {
                    std::memcpy(&mins[k], b + 2, 2);
                } else {
                    const float m = -8.f * fp16_to_fp32(scales[k]);
                    mins[k] = fp32_to_fp16(m);
                    if (!std::isfinite(fp16_to_fp32(mins[k])))
                        throw std::invalid_argument(what + "block " + std::to_string(k) + ": -8 d overflows fp16");
                }
                std::memcpy(&nibbles[k * 16], b + qs, 16);
            }
            seg.q4 = std::make_shared<Q4Matrix>(part.rows, cols, nibbles, scales, mins);
        } else {
            row_kernels(t.type);  // a type the table holds as blocks has its kernels here
            if (t.integer_form == nullptr)  // and the batched product's form (weight_types.cpp)
                throw std::logic_error(std::string("WeightMatrix: no integer form for ") + t.name);
        }
        rows_ += part.rows;
        segments_.push_back(std::move(seg));
    }
}

size_t WeightMatrix::bytes() const {
    size_t n = 0;
    for (const Segment& s : segments_) n += s.q4 ? s.q4->bytes() : s.blocks->size();
    return n;
}

std::string WeightMatrix::type_names() const {
    std::string out;
    for (const Segment& s : segments_) out += std::string(out.empty() ? "" : "+") + s.traits->name;
    return out;
}

bool WeightMatrix::reads_twice_rounded() const {
    for (const Segment& s : segments_)
        if (s.q4) return true;
    return false;
}

bool WeightMatrix::reads_kquant_form() const {
    for (const Segment& s : segments_)
        if (!s.q4 && row_kernels(s.traits->type).kquant_form) return true;
    return false;
}

bool WeightMatrix::reads_pair_form() const {
    for (const Segment& s : segments_)
        if (s.q4 || !row_kernels(s.traits->type).kquant_form) return true;
    return false;
}

void WeightMatrix::multiply_rows(const Q8Activation& x, int r0, int r1, float* y, Isa isa) const {
    if (r0 < 0 || r1 > rows_ || r0 > r1) throw std::out_of_range("WeightMatrix::multiply_rows: rows out of range");
    const size_t n = static_cast<size_t>(cols_);
    // The activation's forms (q4_matrix.h): each the matrix reads, of its width.
    const size_t kq = reads_kquant_form() ? n : x.seq_codes.size();
    const size_t pb = reads_pair_form() ? n / kQ4Block : x.scales.size();
    if (x.cols != cols_ || x.seq_codes.size() != kq || x.rounded_sums16.size() != kq / 16 ||
        x.super_steps.size() != kq / 256 || x.multipliers.size() != kq / 32 || x.rounding_errors.size() != kq / 32 ||
        x.scales.size() != pb || x.residual_scales.size() != pb || x.sums.size() != n / kQ4Block ||
        x.codes.size() < pb * kQ4Block)
        throw std::invalid_argument("WeightMatrix::multiply_rows: an activation of " + std::to_string(x.cols) +
                                    " values for a matrix of " + std::to_string(cols_) + " columns");
    for (const Segment& s : segments_) {
        const int a = r0 > s.row0 ? r0 : s.row0;
        const int b = r1 < s.row0 + s.rows ? r1 : s.row0 + s.rows;
        if (a >= b) continue;
        float* out = y + (a - r0);
        if (s.q4) {
            s.q4->multiply_rows(x, a - s.row0, b - s.row0, out, isa);
            continue;
        }
        const RowKernels& rk = row_kernels(s.traits->type);
        BlockRowsKernel kernel = rk.scalar;
#if defined(MNN_H2O_HAVE_X86_KERNELS)
        if (isa == Isa::Avx512 && cpu_features().avx512_vnni && rk.avx512vnni) kernel = rk.avx512vnni;
        else if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma) kernel = rk.avx2;
#elif defined(__aarch64__)
        if (isa == Isa::Neon) kernel = rk.neon;
#else
        (void)isa;
#endif
        const BlockRows p{s.blocks->data() + static_cast<size_t>(a - s.row0) * s.row_bytes, s.row_bytes, cols_, &x,
                          out};
        kernel(p, 0, b - a);
    }
}

const WeightMatrix::Segment& WeightMatrix::segment_of(int r) const {
    for (const Segment& s : segments_)
        if (r < s.row0 + s.rows) return s;
    throw std::out_of_range("WeightMatrix: row " + std::to_string(r) + " of " + std::to_string(rows_));
}

const uint8_t* WeightMatrix::block_at(const Segment& s, int r, int c) {
    return s.blocks->data() + static_cast<size_t>(r - s.row0) * s.row_bytes +
           static_cast<size_t>(c / s.traits->block_values) * s.traits->block_bytes;
}

void WeightMatrix::integer_row(int r, int c0, int c1, uint8_t* u, float* a, float* b) const {
    if (r < 0 || r >= rows_ || c0 < 0 || c1 > cols_ || c0 > c1)
        throw std::out_of_range("WeightMatrix::integer_row: row or columns out of range");
    const Segment& s = segment_of(r);
    const int bv = s.traits->block_values;
    if (c0 % bv != 0 || c1 % bv != 0)
        throw std::out_of_range(std::string("WeightMatrix::integer_row: columns not whole ") + s.traits->name +
                                " blocks");
    if (s.q4) s.q4->integer_row(r - s.row0, c0 / kQ4Block, c1 / kQ4Block, u, a, b);
    else s.traits->integer_form(block_at(s, r, c0), u, a, b, static_cast<size_t>((c1 - c0) / bv));
}

void WeightMatrix::prefetch_row(int r, int c0, int c1) const {
    if (r < 0 || r >= rows_ || c0 < 0 || c1 > cols_ || c0 >= c1) return;
    const Segment& s = segment_of(r);
    const int bv = s.traits->block_values;
    if (s.q4) {
        s.q4->prefetch_row(r - s.row0, c0 / kQ4Block, (c1 + kQ4Block - 1) / kQ4Block);
        return;
    }
    const uint8_t* p = block_at(s, r, c0);
    const size_t bytes = static_cast<size_t>((c1 - c0 + bv - 1) / bv) * s.traits->block_bytes;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
}

int WeightMatrix::integer_group(int r0, int r1) const {
    if (r0 < 0 || r1 > rows_ || r0 >= r1) throw std::out_of_range("WeightMatrix::integer_group: rows out of range");
    int group = 0;
    for (const Segment& s : segments_)
        if (s.row0 < r1 && r0 < s.row0 + s.rows)
            group = group == 0 ? s.traits->integer_group : std::min(group, s.traits->integer_group);
    return group;
}

}  // namespace mnn_h2o
