// Generated from mnn_h2o/config.py by `python -m mnn_h2o.config --native-header`: do not edit.
// The config keys that reach the native core (docs/config.md): the fields of the native
// config structs, and each key's default and allowed values, so KvCacheConfig, EvictionConfig,
// StoreConfig, their validation, the C API, the saved-session config bytes and the Python
// binding follow the schema; tests/test_config.py fails when this file and the schema disagree.
#pragma once

// The fields of each native config struct, one X(field, key, CType, CppType) per config key
// in the schema's order: field is the member and the Python keyword argument, key the
// key's struct in namespace schema::<section> below, CType the field's type in the C API's
// structs, CppType in the C++ ones (config_field.h: what each type means). Plain C.

#define MNN_H2O_RUNTIME_FIELDS(X) \
    X(threads, threads, int32_t, int) \
    X(dtype, kv_dtype, int32_t, mnn_h2o::KvDtype) \
    X(block_tokens, block_tokens, int32_t, int)

#define MNN_H2O_EVICTION_FIELDS(X) \
    X(policy, policy, const char*, std::string) \
    X(sink_tokens, sink_tokens, int32_t, int) \
    X(recent_tokens, recent_tokens, int32_t, int) \
    X(max_floor_share, max_floor_share, double, double) \
    X(target_keep_ratio, target_keep_ratio, double, double) \
    X(target_lossy_ratio, target_lossy_ratio, double, double) \
    X(kv_budget_bytes, kv_budget_bytes, int64_t, int64_t) \
    X(ema_alpha, ema_alpha, double, double) \
    X(layer_start, layer_start, int32_t, int) \
    X(layer_end, layer_end, int32_t, int) \
    X(trigger_min_tokens, trigger_min_tokens, int32_t, int) \
    X(update_interval, update_interval, int32_t, int) \
    X(per_head_budget, per_head_budget, int32_t, bool) \
    X(seed, seed, int32_t, int) \
    X(observation_window, observation_window, int32_t, int) \
    X(head_floor_share, head_floor_share, double, double) \
    X(layer_budget, layer_budget, const char*, std::string)

#define MNN_H2O_LOSSLESS_FIELDS(X) \
    X(mode, mode, int32_t, mnn_h2o::StoreMode) \
    X(scope, scope, int32_t, mnn_h2o::StoreScope) \
    X(front_n, front_n, int32_t, int) \
    X(hot_sink_tokens, hot_sink_tokens, int32_t, int) \
    X(hot_recent_tokens, hot_recent_tokens, int32_t, int) \
    X(chunk_tokens, chunk_tokens, int32_t, int) \
    X(v_dedup_layers, v_dedup_layers, int32_t, int) \
    X(async_threads, async_threads, int32_t, int) \
    X(max_queue, max_queue, int32_t, int) \
    X(decode_cache_bytes, decode_cache_bytes, int64_t, int64_t) \
    X(prefetch, prefetch, int32_t, bool) \
    X(zstd_level, zstd_level, int32_t, int) \
    X(probe_every, probe_every, int32_t, int)

#ifdef __cplusplus

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace mnn_h2o {
namespace schema {

// How a key's values are checked: against kChoices, against [kLo, kHi], or not at all (a bool).
enum class Check { kNone, kChoices, kBounds };

namespace runtime {
// runtime.threads: int, threads
struct threads { static constexpr const char* kName = "threads"; static constexpr int64_t kDefault = 2; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 64; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 64]"; };
// runtime.kv_dtype: str, -
struct kv_dtype { static constexpr const char* kName = "kv_dtype"; static constexpr const char* kDefault = "q8r"; static constexpr Check kCheck = Check::kChoices; static constexpr const char* kChoices[] = {"f16", "bf16", "f32", "q8", "q4", "q4r", "q8r"}; static constexpr int kChoiceCount = 7; static constexpr const char* kAllowed = "one of 'f16', 'bf16', 'f32', 'q8', 'q4', 'q4r', 'q8r'"; };
// runtime.block_tokens: int, tokens
struct block_tokens { static constexpr const char* kName = "block_tokens"; static constexpr int64_t kDefault = 16; static constexpr Check kCheck = Check::kChoices; static constexpr int64_t kChoices[] = {16, 32, 64, 128, 256}; static constexpr int kChoiceCount = 5; static constexpr const char* kAllowed = "one of 16, 32, 64, 128, 256"; };
}  // namespace runtime

namespace eviction {
// eviction.policy: str, -
struct policy { static constexpr const char* kName = "policy"; static constexpr const char* kDefault = "kvzip"; static constexpr Check kCheck = Check::kChoices; static constexpr const char* kChoices[] = {"h2o", "snapkv", "tova", "keydiff", "vatp", "expected_attention", "streaming", "random", "kvzip", "predicted_kvzip"}; static constexpr int kChoiceCount = 10; static constexpr const char* kAllowed = "one of 'h2o', 'snapkv', 'tova', 'keydiff', 'vatp', 'expected_attention', 'streaming', 'random', 'kvzip', 'predicted_kvzip'"; };
// eviction.sink_tokens: int, tokens
struct sink_tokens { static constexpr const char* kName = "sink_tokens"; static constexpr int64_t kDefault = 64; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1048576]"; };
// eviction.recent_tokens: int, tokens
struct recent_tokens { static constexpr const char* kName = "recent_tokens"; static constexpr int64_t kDefault = 256; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 1048576]"; };
// eviction.max_floor_share: float, fraction
struct max_floor_share { static constexpr const char* kName = "max_floor_share"; static constexpr double kDefault = 1.0; static constexpr Check kCheck = Check::kBounds; static constexpr double kLo = 0.0; static constexpr double kHi = 1.0; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1]"; };
// eviction.target_keep_ratio: float, fraction
struct target_keep_ratio { static constexpr const char* kName = "target_keep_ratio"; static constexpr double kDefault = 0.0; static constexpr Check kCheck = Check::kBounds; static constexpr double kLo = 0.0; static constexpr double kHi = 1.0; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1]"; };
// eviction.target_lossy_ratio: float, x; kInUseMin: its least value when it is the budget
struct target_lossy_ratio { static constexpr const char* kName = "target_lossy_ratio"; static constexpr double kDefault = 3.2; static constexpr Check kCheck = Check::kBounds; static constexpr double kLo = 0.0; static constexpr double kHi = 1000.0; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1000]"; static constexpr double kInUseMin = 1.0; };
// eviction.kv_budget_bytes: int, bytes
struct kv_budget_bytes { static constexpr const char* kName = "kv_budget_bytes"; static constexpr int64_t kDefault = 0; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1125899906842624; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1125899906842624]"; };
// eviction.ema_alpha: float, -
struct ema_alpha { static constexpr const char* kName = "ema_alpha"; static constexpr double kDefault = 0.5; static constexpr Check kCheck = Check::kBounds; static constexpr double kLo = 0.0; static constexpr double kHi = 1.0; static constexpr bool kHiOpen = true; static constexpr const char* kAllowed = "in [0, 1)"; };
// eviction.layer_start: int, layer
struct layer_start { static constexpr const char* kName = "layer_start"; static constexpr int64_t kDefault = 0; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1024; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1024]"; };
// eviction.layer_end: int, layer
struct layer_end { static constexpr const char* kName = "layer_end"; static constexpr int64_t kDefault = -1; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = -1; static constexpr int64_t kHi = 1024; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [-1, 1024]"; };
// eviction.trigger_min_tokens: int, tokens
struct trigger_min_tokens { static constexpr const char* kName = "trigger_min_tokens"; static constexpr int64_t kDefault = 3072; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1048576]"; };
// eviction.update_interval: int, decode tokens
struct update_interval { static constexpr const char* kName = "update_interval"; static constexpr int64_t kDefault = 32; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 1048576]"; };
// eviction.per_head_budget: bool, -
struct per_head_budget { static constexpr const char* kName = "per_head_budget"; static constexpr bool kDefault = false; static constexpr Check kCheck = Check::kNone; };
// eviction.seed: int, -
struct seed { static constexpr const char* kName = "seed"; static constexpr int64_t kDefault = 0; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 2147483647; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 2147483647]"; };
// eviction.observation_window: int, queries
struct observation_window { static constexpr const char* kName = "observation_window"; static constexpr int64_t kDefault = 32; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 1048576]"; };
// eviction.head_floor_share: float, fraction
struct head_floor_share { static constexpr const char* kName = "head_floor_share"; static constexpr double kDefault = 0.0; static constexpr Check kCheck = Check::kBounds; static constexpr double kLo = 0.0; static constexpr double kHi = 1.0; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1]"; };
// eviction.layer_budget: str, -
struct layer_budget { static constexpr const char* kName = "layer_budget"; static constexpr const char* kDefault = "global"; static constexpr Check kCheck = Check::kChoices; static constexpr const char* kChoices[] = {"uniform", "pyramid", "global"}; static constexpr int kChoiceCount = 3; static constexpr const char* kAllowed = "one of 'uniform', 'pyramid', 'global'"; };
}  // namespace eviction

namespace lossless {
// lossless.mode: str, -
struct mode { static constexpr const char* kName = "mode"; static constexpr const char* kDefault = "off"; static constexpr Check kCheck = Check::kChoices; static constexpr const char* kChoices[] = {"off", "probe", "full", "store"}; static constexpr int kChoiceCount = 4; static constexpr const char* kAllowed = "one of 'off', 'probe', 'full', 'store'"; };
// lossless.scope: str, -
struct scope { static constexpr const char* kName = "scope"; static constexpr const char* kDefault = "front_n_and_kept"; static constexpr Check kCheck = Check::kChoices; static constexpr const char* kChoices[] = {"front_n", "kept", "front_n_and_kept"}; static constexpr int kChoiceCount = 3; static constexpr const char* kAllowed = "one of 'front_n', 'kept', 'front_n_and_kept'"; };
// lossless.front_n: int, layers
struct front_n { static constexpr const char* kName = "front_n"; static constexpr int64_t kDefault = 2; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1024; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1024]"; };
// lossless.hot_sink_tokens: int, tokens
struct hot_sink_tokens { static constexpr const char* kName = "hot_sink_tokens"; static constexpr int64_t kDefault = 16; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1048576]"; };
// lossless.hot_recent_tokens: int, tokens
struct hot_recent_tokens { static constexpr const char* kName = "hot_recent_tokens"; static constexpr int64_t kDefault = 16; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1048576]"; };
// lossless.chunk_tokens: int, tokens
struct chunk_tokens { static constexpr const char* kName = "chunk_tokens"; static constexpr int64_t kDefault = 128; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 16; static constexpr int64_t kHi = 4096; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [16, 4096]"; };
// lossless.v_dedup_layers: int, layers
struct v_dedup_layers { static constexpr const char* kName = "v_dedup_layers"; static constexpr int64_t kDefault = 1; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1024; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1024]"; };
// lossless.async_threads: int, threads
struct async_threads { static constexpr const char* kName = "async_threads"; static constexpr int64_t kDefault = 1; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 16; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 16]"; };
// lossless.max_queue: int, jobs
struct max_queue { static constexpr const char* kName = "max_queue"; static constexpr int64_t kDefault = 64; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 65536; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 65536]"; };
// lossless.decode_cache_bytes: int, bytes
struct decode_cache_bytes { static constexpr const char* kName = "decode_cache_bytes"; static constexpr int64_t kDefault = 0; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 0; static constexpr int64_t kHi = 1099511627776; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [0, 1099511627776]"; };
// lossless.prefetch: bool, -
struct prefetch { static constexpr const char* kName = "prefetch"; static constexpr bool kDefault = true; static constexpr Check kCheck = Check::kNone; };
// lossless.zstd_level: int, -
struct zstd_level { static constexpr const char* kName = "zstd_level"; static constexpr int64_t kDefault = 1; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 19; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 19]"; };
// lossless.probe_every: int, chunks
struct probe_every { static constexpr const char* kName = "probe_every"; static constexpr int64_t kDefault = 8; static constexpr Check kCheck = Check::kBounds; static constexpr int64_t kLo = 1; static constexpr int64_t kHi = 1048576; static constexpr bool kHiOpen = false; static constexpr const char* kAllowed = "in [1, 1048576]"; };
}  // namespace lossless

// x is within K's bounds (NaN is not): K::kLo <= x <= K::kHi, or x < K::kHi when K::kHiOpen.
template <class K, class T>
constexpr bool in_bounds(T x) {
    const double v = static_cast<double>(x);
    return v >= static_cast<double>(K::kLo) &&
           (K::kHiOpen ? v < static_cast<double>(K::kHi) : v <= static_cast<double>(K::kHi));
}

// The index of x in K::kChoices (names or numbers), or -1.
template <class K>
constexpr int choice_index(
    std::conditional_t<std::is_arithmetic_v<decltype(K::kDefault)>, int64_t, std::string_view> x) {
    for (int i = 0; i < K::kChoiceCount; ++i)
        if (x == K::kChoices[i]) return i;
    return -1;
}

}  // namespace schema
}  // namespace mnn_h2o

#endif  // __cplusplus
