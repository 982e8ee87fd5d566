// The scalar reference of the codec loops (gear_kernels.h), written so that the compiler
// vectorises the ones without a data dependency (plane split/merge, predictors across a row);
// histograms stay scalar.
#include "gear_kernels.h"

#include <cstring>

namespace mnn_h2o {
namespace gear {
namespace kernels {
namespace scalar {

void split_planes(const uint8_t* elements, size_t count, size_t es, uint8_t* const planes[]) {
    if (es == 2) {
        uint8_t* __restrict lo = planes[0];
        uint8_t* __restrict hi = planes[1];
        for (size_t i = 0; i < count; ++i) {
            uint16_t v;
            std::memcpy(&v, elements + 2 * i, 2);
            lo[i] = static_cast<uint8_t>(v);
            hi[i] = static_cast<uint8_t>(v >> 8);
        }
        return;
    }
    uint8_t* __restrict p0 = planes[0];
    uint8_t* __restrict p1 = planes[1];
    uint8_t* __restrict p2 = planes[2];
    uint8_t* __restrict p3 = planes[3];
    for (size_t i = 0; i < count; ++i) {
        uint32_t v;
        std::memcpy(&v, elements + 4 * i, 4);
        p0[i] = static_cast<uint8_t>(v);
        p1[i] = static_cast<uint8_t>(v >> 8);
        p2[i] = static_cast<uint8_t>(v >> 16);
        p3[i] = static_cast<uint8_t>(v >> 24);
    }
}

void merge_planes(const uint8_t* const planes[], size_t count, size_t es, uint8_t* elements) {
    if (es == 2) {
        const uint8_t* __restrict lo = planes[0];
        const uint8_t* __restrict hi = planes[1];
        for (size_t i = 0; i < count; ++i) {
            const uint16_t v = static_cast<uint16_t>(lo[i] | hi[i] << 8);
            std::memcpy(elements + 2 * i, &v, 2);
        }
        return;
    }
    const uint8_t* __restrict p0 = planes[0];
    const uint8_t* __restrict p1 = planes[1];
    const uint8_t* __restrict p2 = planes[2];
    const uint8_t* __restrict p3 = planes[3];
    for (size_t i = 0; i < count; ++i) {
        const uint32_t v = p0[i] | p1[i] << 8 | p2[i] << 16 | static_cast<uint32_t>(p3[i]) << 24;
        std::memcpy(elements + 4 * i, &v, 4);
    }
}

void split_quant_rows(const uint8_t* rows, size_t n, size_t code_bytes, size_t scales, uint8_t* const planes[]) {
    const size_t row_bytes = code_bytes + 2 * scales;
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* row = rows + t * row_bytes;
        if (code_bytes) std::memcpy(planes[0] + t * code_bytes, row, code_bytes);  // (planes may be null when empty)
        for (size_t g = 0; g < scales; ++g) {
            planes[1][t * scales + g] = row[code_bytes + 2 * g];
            planes[2][t * scales + g] = row[code_bytes + 2 * g + 1];
        }
    }
}

void merge_quant_rows(const uint8_t* const planes[], size_t n, size_t code_bytes, size_t scales, uint8_t* rows) {
    const size_t row_bytes = code_bytes + 2 * scales;
    for (size_t t = 0; t < n; ++t) {
        uint8_t* row = rows + t * row_bytes;
        if (code_bytes) std::memcpy(row, planes[0] + t * code_bytes, code_bytes);
        for (size_t g = 0; g < scales; ++g) {
            row[code_bytes + 2 * g] = planes[1][t * scales + g];
            row[code_bytes + 2 * g + 1] = planes[2][t * scales + g];
        }
    }
}

namespace {

inline uint8_t centre(uint8_t v, uint8_t ref, uint8_t mask, uint8_t other) {
    return static_cast<uint8_t>(((v ^ ref) & 0x80) | (((v & mask) - (ref & mask)) & mask) | (v & other));
}

inline uint8_t uncentre(uint8_t v, uint8_t ref, uint8_t mask, uint8_t other) {
    return static_cast<uint8_t>(((v ^ ref) & 0x80) | (((v & mask) + (ref & mask)) & mask) | (v & other));
}

}  // namespace

size_t sample_histograms(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                         uint32_t (*hist)[256]) {
    const uint8_t other = static_cast<uint8_t>(~(0x80 | mask));
    if (n == 1) {
        for (size_t c = 0; c < C; ++c) {
            ++hist[0][P[c]];
            ++hist[1][P[c]];
            ++hist[2][P[c]];
            if (refs) ++hist[3][centre(P[c], refs[c], mask, other)];
        }
        return C;
    }
    size_t counted = 0;
    for (size_t t = 1; t < n; t += 4, counted += C) {
        const uint8_t* row = P + t * C;
        const uint8_t* prev = row - C;
        for (size_t c = 0; c < C; ++c) {
            ++hist[0][row[c]];
            ++hist[1][row[c] ^ prev[c]];
            ++hist[2][static_cast<uint8_t>(row[c] - prev[c])];
        }
        if (refs) {
            for (size_t c = 0; c < C; ++c) ++hist[3][centre(row[c], refs[c], mask, other)];
        }
    }
    return counted;
}

void delta_forward(const uint8_t* P, size_t n, size_t C, bool use_xor, uint8_t* __restrict R) {
    if (n == 0 || C == 0) return;  // (empty planes may have null buffers)
    std::memcpy(R, P, C);
    for (size_t t = 1; t < n; ++t) {
        const uint8_t* __restrict row = P + t * C;
        const uint8_t* __restrict prev = row - C;
        uint8_t* __restrict out = R + t * C;
        if (use_xor) {
            for (size_t c = 0; c < C; ++c) out[c] = row[c] ^ prev[c];
        } else {
            for (size_t c = 0; c < C; ++c) out[c] = static_cast<uint8_t>(row[c] - prev[c]);
        }
    }
}

void delta_inverse(const uint8_t* R, size_t n, size_t C, bool use_xor, uint8_t* __restrict P) {
    if (n == 0 || C == 0) return;  // (empty planes may have null buffers)
    std::memcpy(P, R, C);
    for (size_t t = 1; t < n; ++t) {
        const uint8_t* __restrict in = R + t * C;
        const uint8_t* __restrict prev = P + (t - 1) * C;
        uint8_t* __restrict row = P + t * C;
        if (use_xor) {
            for (size_t c = 0; c < C; ++c) row[c] = in[c] ^ prev[c];
        } else {
            for (size_t c = 0; c < C; ++c) row[c] = static_cast<uint8_t>(in[c] + prev[c]);
        }
    }
}

void centre_references(const uint8_t* P, size_t n, size_t C, uint8_t mask, uint64_t* sums,
                       uint8_t* refs) {
    uint64_t* __restrict field = sums;
    uint64_t* __restrict sign = sums + C;
    for (size_t c = 0; c < 2 * C; ++c) sums[c] = 0;
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* __restrict row = P + t * C;
        for (size_t c = 0; c < C; ++c) {
            field[c] += row[c] & mask;
            sign[c] += row[c] >> 7;
        }
    }
    centre_references_from_sums(sums, n, C, mask, refs);
}

void centre_references_from_sums(const uint64_t* sums, size_t n, size_t C, uint8_t mask,
                                 uint8_t* refs) {
    const uint64_t* field = sums;
    const uint64_t* sign = sums + C;
    // The field's low bit is bit 0 (BF16, FP32) or bit 2 (FP16): round up in field units.
    const uint32_t unit = mask & -mask;
    const uint64_t round_up = uint64_t{n} * unit - 1;
    for (size_t c = 0; c < C; ++c) {
        const uint32_t mean = static_cast<uint32_t>((field[c] + round_up) / (uint64_t{n} * unit)) * unit;
        refs[c] = static_cast<uint8_t>((2 * sign[c] > n ? 0x80 : 0) | (mean & mask));
    }
}

size_t count_runs(const uint8_t* p, size_t n) {
    if (n == 0) return 0;
    size_t changes = 0;
    for (size_t i = 1; i < n; ++i) changes += p[i] != p[i - 1];
    return 1 + changes;
}

void centre_forward(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* __restrict R) {
    const uint8_t other = static_cast<uint8_t>(~(0x80 | mask));
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* __restrict row = P + t * C;
        uint8_t* __restrict out = R + t * C;
        for (size_t c = 0; c < C; ++c) out[c] = centre(row[c], refs[c], mask, other);
    }
}

void centre_inverse(const uint8_t* R, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* __restrict P) {
    const uint8_t other = static_cast<uint8_t>(~(0x80 | mask));
    for (size_t t = 0; t < n; ++t) {
        const uint8_t* __restrict in = R + t * C;
        uint8_t* __restrict row = P + t * C;
        for (size_t c = 0; c < C; ++c) row[c] = uncentre(in[c], refs[c], mask, other);
    }
}

}  // namespace scalar
}  // namespace kernels
}  // namespace gear
}  // namespace mnn_h2o
