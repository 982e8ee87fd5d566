// Settings of the KV cache's lossless store (lossless_stage.h, docs/kv_cache.md "Lossless store"):
// which blocks are compressed with the Gear codec, in what unit, and what happens to them.
#pragma once

#include <cstddef>

#include <string>

#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/config_field.h"

namespace mnn_h2o {

enum class StoreMode {
    Off = 0,
    Probe,  // encode + decode + verify a sample of cold chunks; the KV is untouched
    Full,   // every cold chunk in scope, verified byte for byte; the KV stays raw
    Store,  // cold chunks are held only compressed; their raw blocks go back to the pool
};
const char* store_mode_name(StoreMode mode);  // "off", "probe", "full", "store"

// Which layers' cold blocks are compressed.
enum class StoreScope {
    FrontN = 0,         // layers [0, front_n)
    Kept,            // the layers where H2O evicts (its [layer_start, layer_end); none while it is off)
    FrontNAndKept,   // both
};
const char* store_scope_name(StoreScope scope);  // "front_n", "kept", "front_n_and_kept"

// The names, matched to the choices of lossless.mode and lossless.scope by name (config_field.h).
template <>
struct EnumNames<StoreMode> {
    static constexpr NamedValue<StoreMode> kTable[] = {
        {StoreMode::Off, "off"}, {StoreMode::Probe, "probe"}, {StoreMode::Full, "full"}, {StoreMode::Store, "store"}};
};
static_assert(names_are_choices<schema::lossless::mode, StoreMode>(), "StoreMode's names are lossless.mode's choices");
template <>
struct EnumNames<StoreScope> {
    static constexpr NamedValue<StoreScope> kTable[] = {{StoreScope::FrontN, "front_n"},
                                                        {StoreScope::Kept, "kept"},
                                                        {StoreScope::FrontNAndKept, "front_n_and_kept"}};
};
static_assert(names_are_choices<schema::lossless::scope, StoreScope>(), "StoreScope's names are lossless.scope's choices");

// Faults to inject, for tests: each must end with the data still valid and the fallback counted.
struct StoreFaults {
    bool encode_error = false;     // every encode fails
    bool verify_mismatch = false;  // every verification finds a difference
    bool alloc_failure = false;    // raw blocks cannot be had when a chunk is dissolved
    bool worker_exception = false; // every job throws
};

// One field per config key lossless.* (docs/config.md says what each does), from the schema's
// list (config_schema.h), with its C++ type, default and allowed values; then the test faults.
// chunk_tokens is a multiple of the cache's block_tokens; decode_cache_bytes is the budget of the
// decode cache (store mode); prefetch needs async_threads >= 1.
struct StoreConfig {
#define MNN_H2O_MEMBER(field, key, CType, CppType) CppType field = schema_default<schema::lossless::key, CppType>();
    MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_MEMBER)
#undef MNN_H2O_MEMBER
    StoreFaults faults;

    // The layer scope holds layers [0, front_n) / H2O's layers.
    bool front_n_scope() const { return scope != StoreScope::Kept; }
    bool kept_scope() const { return scope != StoreScope::FrontN; }
};

// An empty string if config is valid for cache, else a message that starts with the name of the
// first bad field: each field against the schema, then against the cache (its block_tokens, and
// its n_layers when above 0: 0 judges the config alone, as config.validate asks through the
// binding).
std::string store_config_error(const StoreConfig& config, const KvCacheConfig& cache);

// Throws std::invalid_argument "enable_store: <store_config_error>" for an invalid config.
void validate_store_config(const StoreConfig& config, const KvCacheConfig& cache);

}  // namespace mnn_h2o
