// The element types of the KV cache: everything the rest of the core needs to know about one.
//
// A cached token is one row of head_dim elements per kv head, for K and again for V. Float types
// store the elements themselves; the quantised types store head_dim small integers followed by one
// fp16 scale per group of kKvQuantGroup elements (docs/kv_cache.md "Row formats"):
//
//   f16, bf16, f32   head_dim * 2 / 2 / 4 bytes
//   q8               head_dim int8 (symmetric, q in [-127, 127], x ~ q * scale), then the scales
//   q8r              as q8
//   q4, q4r          head_dim / 2 bytes of 4-bit codes (element 2i in the low nibble of byte i,
//                    code = q + 8, q in [-8, 7]), then the scales
//
// q4r and q8r are q4 and q8 over rows rotated by the normalised Walsh-Hadamard transform of size
// head_dim: K, V and the queries are rotated alike, so scores are unchanged in exact arithmetic
// while outliers are spread over the whole row before rounding; attention's output is rotated
// back.
//
// Adding a type: its enum value (and the C API's MNN_H2O_DTYPE_*), its row of EnumNames below,
// its name in the choices of runtime.kv_dtype (mnn_h2o/config.py, then regenerate
// config_schema.h), a row of kTraits in kv_dtype.cpp, its reference conversions there, and its
// load in the kernels (attention_scalar.cpp, attention_simd.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mnn_h2o/config_field.h"

namespace mnn_h2o {

// The values are the C API's MNN_H2O_DTYPE_* and what a saved session stores.
enum class KvDtype { F16 = 0, BF16 = 1, F32 = 2, Q8 = 3, Q4 = 4, Q4R = 5, Q8R = 6 };
constexpr int kKvDtypeCount = 7;

// The names, matched to runtime.kv_dtype's choices by name (config_field.h).
template <>
struct EnumNames<KvDtype> {
    static constexpr NamedValue<KvDtype> kTable[] = {
        {KvDtype::F16, "f16"}, {KvDtype::BF16, "bf16"}, {KvDtype::F32, "f32"}, {KvDtype::Q8, "q8"},
        {KvDtype::Q4, "q4"},   {KvDtype::Q4R, "q4r"},   {KvDtype::Q8R, "q8r"},
    };
};
static_assert(names_are_choices<schema::runtime::kv_dtype, KvDtype>(),
              "KvDtype's names are runtime.kv_dtype's choices (mnn_h2o/config.py)");
static_assert(std::size(EnumNames<KvDtype>::kTable) == kKvDtypeCount, "a name per KvDtype");

// Elements per scale of the quantised types.
constexpr int kKvQuantGroup = 32;

// "f16", "bf16", ...: the schema's choices of runtime.kv_dtype, the one spelling used by config,
// bindings, C API and docs ("?" for a value outside the enum).
const char* kv_dtype_name(KvDtype dtype);
// The type named `name`; false if there is none.
bool kv_dtype_from_name(const std::string& name, KvDtype* dtype);
// Every name, comma-separated, for error messages.
std::string kv_dtype_names();
bool kv_dtype_valid(int value);

bool kv_dtype_quantised(KvDtype dtype);
bool kv_dtype_rotated(KvDtype dtype);
// The type whose bytes a rotated type's rows use (q4 for q4r, q8 for q8r), or dtype itself: what
// the kernels read.
KvDtype kv_storage_dtype(KvDtype dtype);

// Bytes of one cached row of head_dim elements, scales included.
size_t kv_row_bytes(KvDtype dtype, int head_dim);
// Why a head_dim cannot be stored in dtype ("" if it can): the quantised types need whole groups,
// the rotation a power of two.
std::string kv_dtype_shape_error(KvDtype dtype, int head_dim);

// Reference conversion of n_rows rows between fp32 and the row format (rotation not included:
// see hadamard_rows). Quantisation is deterministic and the same on every ISA (the SIMD paths
// only ever read quantised rows). Non-finite inputs give finite codes; no undefined behaviour.
void kv_rows_from_f32(KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim);
void kv_rows_to_f32(KvDtype dtype, const void* src, float* dst, size_t n_rows, int head_dim);
// The bytes a cache of dtype holds for these rows: kv_rows_from_f32, after the rotation for the
// rotated types (src is left unchanged).
void kv_rows_as_stored(KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim);

// In place, each of n_rows rows of n elements (n a power of two) times the normalised
// Walsh-Hadamard matrix H / sqrt(n), which is its own inverse: the scalar reference of
// rotate_rows (attention.h), whose SIMD paths give the same bits (the same additions in the same
// order, then the product with hadamard_scale(n)).
void hadamard_rows(float* rows, size_t n_rows, int n);
float hadamard_scale(int n);  // 1 / sqrt(n)

}  // namespace mnn_h2o
