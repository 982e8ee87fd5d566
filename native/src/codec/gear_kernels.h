// The per-byte loops of the Gear codec (internal to gear_codec.cpp). Planes are n x C byte
// matrices, row t = token t; see docs/gear_format.md, "Planes" and "Predictors".
//
// Each loop exists as a scalar reference and, on AArch64, as NEON; the codec uses one set picked
// at compile time (kIsaName says which).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnn_h2o {
namespace gear {
namespace kernels {

// The portable reference (gear_kernels.cpp), compiled everywhere; tests compare every other set
// against it byte for byte.
namespace scalar {

// Element bytes -> planes (plane k = byte k of every element), and back. es is 2 or 4.
void split_planes(const uint8_t* elements, size_t count, size_t es, uint8_t* const planes[]);
void merge_planes(const uint8_t* const planes[], size_t count, size_t es, uint8_t* elements);

// Quantised rows (code_bytes of codes, then `scales` binary16 scales) -> the codes plane and the
// scales' low- and high-byte planes (docs/gear_format.md "Quantised rows"), and back.
void split_quant_rows(const uint8_t* rows, size_t n, size_t code_bytes, size_t scales, uint8_t* const planes[]);
void merge_quant_rows(const uint8_t* const planes[], size_t n, size_t code_bytes, size_t scales, uint8_t* rows);

// Byte histograms of plane P's predicted values on the sampled rows t = 1, 5, 9, ... (row 0 when
// n = 1): hist[0] raw, hist[1] xor, hist[2] delta and, when refs is not null, hist[3] centre
// (added to the counts). Returns the number of bytes counted per histogram.
size_t sample_histograms(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                         uint32_t (*hist)[256]);

// The xor (use_xor) or delta predictor along tokens, and its inverse.
void delta_forward(const uint8_t* P, size_t n, size_t C, bool use_xor, uint8_t* R);
void delta_inverse(const uint8_t* R, size_t n, size_t C, bool use_xor, uint8_t* P);

// References of the centre predictor: per channel, the majority sign and the rounded-up mean of
// the exponent field. sums is scratch of 2 * C.
void centre_references(const uint8_t* P, size_t n, size_t C, uint8_t mask, uint64_t* sums,
                       uint8_t* refs);
// Its last step, shared by every ISA: refs from sums[0..C) (exponent fields) and sums[C..2C)
// (sign bits) accumulated over n rows.
void centre_references_from_sums(const uint64_t* sums, size_t n, size_t C, uint8_t mask,
                                 uint8_t* refs);

// Number of runs of equal bytes (1 + the positions where a byte differs from the one before).
size_t count_runs(const uint8_t* p, size_t n);

// The centre predictor with references refs[C] and exponent field mask, and its inverse.
void centre_forward(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* R);
void centre_inverse(const uint8_t* R, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* P);

}  // namespace scalar

// NEON versions of the loops that stream whole planes (gear_kernels_neon.cpp, AArch64 only).
// The histograms and the quantised rows' split stay scalar. Results are bit-identical to scalar::.
#if defined(__aarch64__)
#define MNN_H2O_GEAR_NEON 1
namespace neon {
void split_planes(const uint8_t* elements, size_t count, size_t es, uint8_t* const planes[]);
void merge_planes(const uint8_t* const planes[], size_t count, size_t es, uint8_t* elements);
void delta_forward(const uint8_t* P, size_t n, size_t C, bool use_xor, uint8_t* R);
void delta_inverse(const uint8_t* R, size_t n, size_t C, bool use_xor, uint8_t* P);
void centre_references(const uint8_t* P, size_t n, size_t C, uint8_t mask, uint64_t* sums,
                       uint8_t* refs);
size_t count_runs(const uint8_t* p, size_t n);
void centre_forward(const uint8_t* P, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* R);
void centre_inverse(const uint8_t* R, size_t n, size_t C, const uint8_t* refs, uint8_t mask,
                    uint8_t* P);
}  // namespace neon
#endif

// The set the codec calls (kernels::split_planes, ...), chosen at compile time: every AArch64
// CPU has NEON, so no run-time check is needed.
#if defined(MNN_H2O_GEAR_NEON)
constexpr const char* kIsaName = "neon";
namespace chosen = neon;
#else
constexpr const char* kIsaName = "scalar";
namespace chosen = scalar;
#endif
using chosen::split_planes;
using chosen::merge_planes;
using scalar::split_quant_rows;  // no NEON version: mostly row copies
using scalar::merge_quant_rows;
using scalar::sample_histograms;  // no NEON version
using chosen::delta_forward;
using chosen::delta_inverse;
using chosen::centre_references;
using chosen::count_runs;
using chosen::centre_forward;
using chosen::centre_inverse;

}  // namespace kernels
}  // namespace gear
}  // namespace mnn_h2o
