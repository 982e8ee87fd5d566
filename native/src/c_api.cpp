// The C API (mnn_h2o/mnn_h2o.h) over KvCache and gear::Codec. Every entry point catches all
// exceptions and turns them into a status plus a per-thread message.
#include "mnn_h2o/mnn_h2o.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "codec/gear_kernels.h"
#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/eviction/eviction_config.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/cache/kv_cache.h"

struct mnn_h2o_kv_cache {
    explicit mnn_h2o_kv_cache(const mnn_h2o::KvCacheConfig& c) : cache(c) {}
    mnn_h2o::KvCache cache;
};

struct mnn_h2o_codec {
    explicit mnn_h2o_codec(const mnn_h2o::gear::EncodeOptions& o) : codec(o) {}
    mnn_h2o::gear::Codec codec;
};

namespace {

using mnn_h2o::KvCache;
using mnn_h2o::KvCacheConfig;
using mnn_h2o::gear::Status;

#define MNN_H2O_STR2(x) #x
#define MNN_H2O_STR(x) MNN_H2O_STR2(x)
constexpr const char* kVersion =
    MNN_H2O_STR(MNN_H2O_VERSION_MAJOR) "." MNN_H2O_STR(MNN_H2O_VERSION_MINOR) "." MNN_H2O_STR(MNN_H2O_VERSION_PATCH);

// Per thread; a fixed buffer so that recording an error never allocates (or throws).
thread_local char t_last_error[512] = "";

// Records "where: what" as this thread's last error; never allocates or throws.
mnn_h2o_status fail(mnn_h2o_status status, const char* where, const char* what) noexcept {
    std::snprintf(t_last_error, sizeof t_last_error, "%s: %s", where, what ? what : "");
    return status;
}

mnn_h2o_status fail(mnn_h2o_status status, const char* where, const std::string& what) {
    return fail(status, where, what.c_str());
}

// Runs fn, mapping exceptions to statuses (the specific logic_errors before std::exception).
template <class Fn>
mnn_h2o_status guarded(const char* where, Fn&& fn) noexcept {
    try {
        return fn();
    } catch (const std::bad_alloc&) {
        return fail(MNN_H2O_ERR_OUT_OF_MEMORY, where, "out of memory");
    } catch (const std::length_error& e) {
        return fail(MNN_H2O_ERR_CAPACITY, where, e.what());
    } catch (const std::invalid_argument& e) {
        return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, e.what());
    } catch (const std::out_of_range& e) {
        return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, e.what());
    } catch (const std::exception& e) {
        return fail(MNN_H2O_ERR_INTERNAL, where, e.what());
    } catch (...) {
        return fail(MNN_H2O_ERR_INTERNAL, where, "unknown exception");
    }
}

mnn_h2o_status null_arg(const char* where, const char* what) noexcept {
    char msg[96];
    std::snprintf(msg, sizeof msg, "%s is null", what);
    return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, msg);
}

mnn_h2o_status from_codec(const char* where, Status s) {
    mnn_h2o_status out = MNN_H2O_ERR_INTERNAL;
    switch (s) {
        case Status::Ok: return MNN_H2O_OK;
        case Status::InvalidArgument: out = MNN_H2O_ERR_INVALID_ARGUMENT; break;
        case Status::OutputTooSmall: out = MNN_H2O_ERR_OUTPUT_TOO_SMALL; break;
        case Status::Truncated: out = MNN_H2O_ERR_TRUNCATED; break;
        case Status::BadMagic: out = MNN_H2O_ERR_BAD_MAGIC; break;
        case Status::BadVersion: out = MNN_H2O_ERR_BAD_VERSION; break;
        case Status::BadHeader: out = MNN_H2O_ERR_BAD_HEADER; break;
        case Status::Corrupt: out = MNN_H2O_ERR_CORRUPT; break;
        case Status::ChecksumMismatch: out = MNN_H2O_ERR_CHECKSUM; break;
        case Status::ZstdUnavailable: out = MNN_H2O_ERR_ZSTD_UNAVAILABLE; break;
    }
    return fail(out, where, mnn_h2o::gear::status_name(s));
}

bool valid_isa(mnn_h2o_isa isa) { return isa >= MNN_H2O_ISA_SCALAR && isa <= MNN_H2O_ISA_NEON; }

bool make_shape(uint32_t ndim, const uint32_t* dims, mnn_h2o::gear::Shape* shape) {
    if (ndim < 1 || ndim > mnn_h2o::gear::kMaxDims || !dims) return false;
    shape->ndim = ndim;
    for (uint32_t i = 0; i < ndim; ++i) shape->dims[i] = dims[i];
    return true;
}

static_assert(MNN_H2O_ELEM_Q8 == static_cast<int>(mnn_h2o::gear::ElementType::Q8) &&
                  MNN_H2O_ELEM_Q4 == static_cast<int>(mnn_h2o::gear::ElementType::Q4),
              "mnn_h2o_elem_type follows gear::ElementType");
bool valid_elem(mnn_h2o_elem_type t) {
    return t == MNN_H2O_ELEM_F16 || t == MNN_H2O_ELEM_BF16 || t == MNN_H2O_ELEM_F32 || t == MNN_H2O_ELEM_Q8 ||
           t == MNN_H2O_ELEM_Q4;
}

// The fields mnn_h2o_codec_options shares with EncodeOptions, copied either way (the flags are
// bools on one side, 0/1 on the other).
template <class From, class To>
void copy_codec_options(const From& from, To& to) {
    to.predictors = from.predictors;
    to.allow_rle = from.allow_rle;
    to.allow_zstd = from.allow_zstd;
    to.zstd_level = from.zstd_level;
    to.block_tokens = from.block_tokens;
    to.dedup = from.dedup;
}

// guarded() for an entry point on a cache handle: a null handle is an error naming it, else fn
// gets the cache (const through a const handle).
template <class Handle, class Fn>
mnn_h2o_status on_cache(const char* where, Handle* cache, Fn&& fn) noexcept {
    return guarded(where, [&]() -> mnn_h2o_status {
        if (!cache) return null_arg(where, "cache");
        return fn(cache->cache);
    });
}

// One field between a C API struct and its C++ struct, either way: numbers convert, a bool is 0/1
// in C, an enum its value (one outside the enum reaches the C++ validation, which names the
// allowed ones); a C string points into the C++ struct's string (which must outlive it), and a
// NULL one leaves the C++ default.
template <class From, class To>
void convert(const From& from, To* to) {
    if constexpr (std::is_same_v<To, std::string>) {
        if (from) *to = from;
    } else if constexpr (std::is_same_v<From, std::string>) {
        *to = from.c_str();
    } else if constexpr (std::is_same_v<To, bool>) {
        *to = from != 0;
    } else {
        *to = static_cast<To>(from);
    }
}

// mnn_h2o_kv_config <-> KvCacheConfig: the shape and capacity, then the config keys (their list:
// config_schema.h).
template <class From, class To>
void copy_kv_config(const From& from, To* to) {
    to->n_layers = from.n_layers;
    to->n_kv_heads = from.n_kv_heads;
    to->n_heads = from.n_heads;
    to->head_dim = from.head_dim;
    to->max_tokens = from.max_tokens;
#define MNN_H2O_COPY(field, key, CType, CppType) convert(from.field, &to->field);
    MNN_H2O_RUNTIME_FIELDS(MNN_H2O_COPY)
}

// mnn_h2o_eviction_config <-> EvictionConfig: every config key h2o.* of the core.
template <class From, class To>
void copy_eviction_config(const From& from, To* to) {
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_COPY)
#undef MNN_H2O_COPY
}

void to_c(const KvCacheConfig& c, mnn_h2o_kv_config* out) { copy_kv_config(c, out); }

KvCacheConfig from_c(const mnn_h2o_kv_config& in) {
    KvCacheConfig c;
    copy_kv_config(in, &c);
    return c;
}

// The C struct's strings point into c's: c must outlive it.
void to_c(const mnn_h2o::EvictionConfig& c, mnn_h2o_eviction_config* out) { copy_eviction_config(c, out); }

mnn_h2o::EvictionConfig from_c(const mnn_h2o_eviction_config& in) {
    mnn_h2o::EvictionConfig c;
    copy_eviction_config(in, &c);
    return c;
}

}  // namespace

extern "C" {

const char* mnn_h2o_status_name(mnn_h2o_status status) {
    switch (status) {
        case MNN_H2O_OK: return "ok";
        case MNN_H2O_ERR_INVALID_ARGUMENT: return "invalid_argument";
        case MNN_H2O_ERR_OUT_OF_MEMORY: return "out_of_memory";
        case MNN_H2O_ERR_CAPACITY: return "capacity";
        case MNN_H2O_ERR_UNSUPPORTED: return "unsupported";
        case MNN_H2O_ERR_INTERNAL: return "internal";
        case MNN_H2O_ERR_OUTPUT_TOO_SMALL: return "output_too_small";
        case MNN_H2O_ERR_TRUNCATED: return "truncated";
        case MNN_H2O_ERR_BAD_MAGIC: return "bad_magic";
        case MNN_H2O_ERR_BAD_VERSION: return "bad_version";
        case MNN_H2O_ERR_BAD_HEADER: return "bad_header";
        case MNN_H2O_ERR_CORRUPT: return "corrupt";
        case MNN_H2O_ERR_CHECKSUM: return "checksum";
        case MNN_H2O_ERR_ZSTD_UNAVAILABLE: return "zstd_unavailable";
    }
    return "unknown";
}

const char* mnn_h2o_last_error(void) { return t_last_error; }

const char* mnn_h2o_version(void) { return kVersion; }

mnn_h2o_isa mnn_h2o_best_isa(void) { return static_cast<mnn_h2o_isa>(mnn_h2o::best_isa()); }

const char* mnn_h2o_isa_name(mnn_h2o_isa isa) {
    return valid_isa(isa) ? mnn_h2o::isa_name(static_cast<mnn_h2o::Isa>(isa)) : "unknown";
}

int mnn_h2o_isa_available(mnn_h2o_isa isa) {
    return valid_isa(isa) && mnn_h2o::isa_available(static_cast<mnn_h2o::Isa>(isa)) ? 1 : 0;
}

const char* mnn_h2o_codec_isa_name(void) { return mnn_h2o::gear::kernels::kIsaName; }

// ---- KV cache ----------------------------------------------------------------------------------

void mnn_h2o_kv_config_init(mnn_h2o_kv_config* config) {
    // KvCacheConfig's defaults are the config schema's.
    if (config) to_c(mnn_h2o::KvCacheConfig{}, config);
}

mnn_h2o_status mnn_h2o_kv_cache_create(const mnn_h2o_kv_config* config, mnn_h2o_kv_cache** cache) {
    return guarded("mnn_h2o_kv_cache_create", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_create", "cache");
        *cache = nullptr;
        if (!config) return null_arg("mnn_h2o_kv_cache_create", "config");
        *cache = new mnn_h2o_kv_cache(from_c(*config));
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_create_windowed(const mnn_h2o_kv_config* config, const int32_t* windows,
                                                mnn_h2o_kv_cache** cache) {
    const char* where = "mnn_h2o_kv_cache_create_windowed";
    return guarded(where, [&]() -> mnn_h2o_status {
        if (!cache) return null_arg(where, "cache");
        *cache = nullptr;
        if (!config) return null_arg(where, "config");
        if (!windows) return null_arg(where, "windows");
        KvCacheConfig c = from_c(*config);
        if (config->n_layers > 0) c.windows.assign(windows, windows + config->n_layers);  // KvCache checks each
        *cache = new mnn_h2o_kv_cache(c);
        return MNN_H2O_OK;
    });
}

int32_t mnn_h2o_kv_cache_window(const mnn_h2o_kv_cache* cache, int32_t layer) {
    if (!cache || layer < 0 || layer >= cache->cache.config().n_layers) return -1;
    return cache->cache.window(layer);
}

void mnn_h2o_kv_cache_destroy(mnn_h2o_kv_cache* cache) { delete cache; }

mnn_h2o_status mnn_h2o_kv_cache_get_config(const mnn_h2o_kv_cache* cache, mnn_h2o_kv_config* config) {
    const char* where = "mnn_h2o_kv_cache_get_config";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!config) return null_arg(where, "config");
        to_c(c.config(), config);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_append(mnn_h2o_kv_cache* cache, int32_t layer, const float* k, const float* v,
                                       int32_t n_tokens) {
    return on_cache("mnn_h2o_kv_cache_append", cache, [&](KvCache& c) {
        c.append(layer, k, v, n_tokens);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_attend(mnn_h2o_kv_cache* cache, int32_t layer, const float* q, int32_t n_q,
                                       float* out, float* block_scores, size_t scores_stride) {
    return on_cache("mnn_h2o_kv_cache_attend", cache, [&](KvCache& c) {
        c.attend(layer, q, n_q, out, block_scores, scores_stride);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_step(mnn_h2o_kv_cache* cache, int32_t layer, const float* q, const float* k,
                                     const float* v, int32_t n_tokens, float* out, float* block_scores,
                                     size_t scores_stride) {
    return on_cache("mnn_h2o_kv_cache_step", cache, [&](KvCache& c) {
        c.step(layer, q, k, v, n_tokens, out, block_scores, scores_stride);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_length(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                       int32_t* length) {
    const char* where = "mnn_h2o_kv_cache_length";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!length) return null_arg(where, "length");
        *length = c.length(layer, head);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_read(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head, float* k_out,
                                     float* v_out) {
    const char* where = "mnn_h2o_kv_cache_read";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!k_out || !v_out) return null_arg(where, !k_out ? "k_out" : "v_out");
        c.read(layer, head, k_out, v_out);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_truncate(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head, int32_t n_tokens) {
    return on_cache("mnn_h2o_kv_cache_truncate", cache, [&](KvCache& c) {
        c.truncate(layer, head, n_tokens);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_reset(mnn_h2o_kv_cache* cache) {
    return on_cache("mnn_h2o_kv_cache_reset", cache, [&](KvCache& c) {
        c.reset();
        return MNN_H2O_OK;
    });
}

size_t mnn_h2o_kv_cache_bytes_held(const mnn_h2o_kv_cache* cache) { return cache ? cache->cache.bytes_held() : 0; }

size_t mnn_h2o_kv_cache_bytes_mapped(const mnn_h2o_kv_cache* cache) {
    return cache ? cache->cache.bytes_mapped() : 0;
}

int32_t mnn_h2o_kv_cache_max_blocks(const mnn_h2o_kv_cache* cache) { return cache ? cache->cache.max_blocks() : 0; }

// ---- eviction ------------------------------------------------------------------------------------

const char* mnn_h2o_policy_name(int32_t i) {
    const std::vector<std::string>& names = mnn_h2o::policy_list();
    return i >= 0 && static_cast<size_t>(i) < names.size() ? names[static_cast<size_t>(i)].c_str() : nullptr;
}

void mnn_h2o_eviction_config_init(mnn_h2o_eviction_config* config) {
    if (!config) return;
    static_assert(mnn_h2o::kSkipReasons == 4, "mnn_h2o_eviction_layer_stats.skipped has 4 entries");
    // EvictionConfig's defaults are the config schema's; the strings point into this static copy.
    static const mnn_h2o::EvictionConfig kDefaults;
    to_c(kDefaults, config);
}

mnn_h2o_status mnn_h2o_kv_cache_enable_eviction(mnn_h2o_kv_cache* cache, const mnn_h2o_eviction_config* config) {
    const char* where = "mnn_h2o_kv_cache_enable_eviction";
    return on_cache(where, cache, [&](KvCache& c) {
        if (!config) return null_arg(where, "config");
        c.enable_eviction(from_c(*config));
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_disable_eviction(mnn_h2o_kv_cache* cache) {
    return on_cache("mnn_h2o_kv_cache_disable_eviction", cache, [&](KvCache& c) {
        c.disable_eviction();
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_get_eviction_config(const mnn_h2o_kv_cache* cache, mnn_h2o_eviction_config* config) {
    const char* where = "mnn_h2o_kv_cache_get_eviction_config";
    return on_cache(where, cache, [&](const KvCache& cc) {
        if (!config) return null_arg(where, "config");
        const mnn_h2o::EvictionConfig* c = cc.eviction_config();
        if (!c) return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, "eviction is off");
        to_c(*c, config);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_end_step(mnn_h2o_kv_cache* cache, int32_t n_tokens, int32_t prefill,
                                         int32_t* evicted) {
    if (evicted) *evicted = 0;
    return on_cache("mnn_h2o_kv_cache_end_step", cache, [&](KvCache& c) {
        const bool any = c.end_step(n_tokens, prefill != 0);
        if (evicted) *evicted = any ? 1 : 0;
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_evict(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                      const mnn_h2o_token_run* runs, size_t n_runs) {
    const char* where = "mnn_h2o_kv_cache_evict";
    return on_cache(where, cache, [&](KvCache& c) {
        if (!runs && n_runs) return null_arg(where, "runs");
        std::vector<mnn_h2o::TokenRun> plan(n_runs);
        for (size_t i = 0; i < n_runs; ++i) {
            plan[i].offset = runs[i].offset;
            plan[i].length = runs[i].length;
        }
        c.evict(layer, head, plan);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_eviction_stats(const mnn_h2o_kv_cache* cache, mnn_h2o_eviction_stats* stats) {
    const char* where = "mnn_h2o_kv_cache_eviction_stats";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!stats) return null_arg(where, "stats");
        const mnn_h2o::EvictionStats st = c.eviction_stats();
        std::memset(stats, 0, sizeof *stats);
        stats->bytes_held = st.bytes_held;
        stats->bytes_uncompressed = st.bytes_uncompressed;
        stats->lossy_ratio = st.lossy_ratio;
        stats->bytes_f16 = st.bytes_f16;
        stats->whole_model_ratio = st.whole_model_ratio;
        stats->policy_us = st.policy_us;
        stats->compact_us = st.compact_us;
        stats->updates = st.updates;
        for (const auto& layer : st.layers) {
            stats->evictions += layer.counters.evictions;
            stats->blocks_freed += layer.counters.blocks_freed;
            stats->invalid_plans += layer.counters.invalid_plans;
        }
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_eviction_layer_stats(const mnn_h2o_kv_cache* cache, int32_t layer,
                                                mnn_h2o_eviction_layer_stats* stats) {
    const char* where = "mnn_h2o_kv_cache_eviction_layer_stats";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!stats) return null_arg(where, "stats");
        const mnn_h2o::EvictionStats st = c.eviction_stats();
        if (layer < 0 || static_cast<size_t>(layer) >= st.layers.size())
            return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, "layer " + std::to_string(layer) + " out of range");
        const auto& l = st.layers[static_cast<size_t>(layer)];
        std::memset(stats, 0, sizeof *stats);
        stats->tokens_seen = l.counters.tokens_seen;
        stats->evictions = l.counters.evictions;
        stats->blocks_freed = l.counters.blocks_freed;
        stats->invalid_plans = l.counters.invalid_plans;
        stats->policy_us = l.counters.policy_us;
        stats->compact_us = l.counters.compact_us;
        stats->bytes_held = l.bytes_held;
        for (int i = 0; i < mnn_h2o::kSkipReasons; ++i) stats->skipped[i] = l.counters.skipped[static_cast<size_t>(i)];
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_eviction_scores(const mnn_h2o_kv_cache* cache, int32_t layer, float* scores,
                                           size_t capacity, int32_t* n_blocks) {
    const char* where = "mnn_h2o_kv_cache_eviction_scores";
    return on_cache(where, cache, [&](const KvCache& c) {
        if (!n_blocks) return null_arg(where, "n_blocks");
        int nb = 0;
        const std::vector<float> s = c.eviction_scores(layer, &nb);
        *n_blocks = nb;
        if (!scores || capacity < s.size())
            return fail(MNN_H2O_ERR_OUTPUT_TOO_SMALL, where,
                        "need " + std::to_string(s.size()) + " floats, capacity " + std::to_string(capacity));
        std::memcpy(scores, s.data(), s.size() * sizeof(float));
        return MNN_H2O_OK;
    });
}

// ---- Gear codec --------------------------------------------------------------------------------

void mnn_h2o_codec_options_init(mnn_h2o_codec_options* options) {
    if (options) copy_codec_options(mnn_h2o::gear::EncodeOptions{}, *options);
}

mnn_h2o_status mnn_h2o_codec_create(const mnn_h2o_codec_options* options, mnn_h2o_codec** codec) {
    return guarded("mnn_h2o_codec_create", [&]() -> mnn_h2o_status {
        if (!codec) return null_arg("mnn_h2o_codec_create", "codec");
        *codec = nullptr;
        mnn_h2o_codec_options o;
        mnn_h2o_codec_options_init(&o);
        if (options) o = *options;
        if (o.predictors & ~MNN_H2O_PREDICT_ALL)
            return fail(MNN_H2O_ERR_INVALID_ARGUMENT, "mnn_h2o_codec_create", "unknown predictor bits");
        mnn_h2o::gear::EncodeOptions e;
        copy_codec_options(o, e);
        *codec = new mnn_h2o_codec(e);
        return MNN_H2O_OK;
    });
}

void mnn_h2o_codec_destroy(mnn_h2o_codec* codec) { delete codec; }

size_t mnn_h2o_codec_bound(const mnn_h2o_codec* codec, mnn_h2o_elem_type type, uint32_t ndim, const uint32_t* dims) {
    mnn_h2o::gear::Shape shape;
    if (!codec || !valid_elem(type) || !make_shape(ndim, dims, &shape)) return 0;
    return mnn_h2o::gear::max_encoded_size(static_cast<mnn_h2o::gear::ElementType>(type), shape,
                                           codec->codec.options().block_tokens);
}

mnn_h2o_status mnn_h2o_codec_encode(mnn_h2o_codec* codec, const void* data, mnn_h2o_elem_type type, uint32_t ndim,
                                    const uint32_t* dims, uint8_t* out, size_t capacity, size_t* written) {
    return guarded("mnn_h2o_codec_encode", [&]() -> mnn_h2o_status {
        const char* where = "mnn_h2o_codec_encode";
        if (!codec) return null_arg(where, "codec");
        if (!written) return null_arg(where, "written");
        *written = 0;
        if (!out && capacity) return null_arg(where, "out");
        if (!valid_elem(type)) return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, "unknown element type");
        mnn_h2o::gear::Shape shape;
        if (!make_shape(ndim, dims, &shape))
            return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, "ndim must be in [1, 8] and dims set");
        if (!data && shape.elements() > 0) return null_arg(where, "data");
        return from_codec(where, codec->codec.encode(data, static_cast<mnn_h2o::gear::ElementType>(type), shape, out,
                                                     capacity, written));
    });
}

mnn_h2o_status mnn_h2o_codec_frame_info(const uint8_t* frame, size_t size, mnn_h2o_frame_info* info) {
    return guarded("mnn_h2o_codec_frame_info", [&]() -> mnn_h2o_status {
        if (!info) return null_arg("mnn_h2o_codec_frame_info", "info");
        if (!frame && size) return null_arg("mnn_h2o_codec_frame_info", "frame");
        std::memset(info, 0, sizeof *info);
        mnn_h2o::gear::FrameInfo fi;
        const Status s = mnn_h2o::gear::read_frame_info(frame, size, &fi);
        if (s != Status::Ok) return from_codec("mnn_h2o_codec_frame_info", s);
        info->elem_type = static_cast<int32_t>(fi.element_type);
        info->ndim = fi.shape.ndim;
        for (uint32_t i = 0; i < fi.shape.ndim && i < MNN_H2O_CODEC_MAX_DIMS; ++i) info->dims[i] = fi.shape.dims[i];
        info->block_tokens = fi.block_tokens;
        info->data_checksum = fi.data_checksum;
        info->header_size = fi.header_size;
        info->decoded_size = fi.decoded_size;
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_codec_decode(mnn_h2o_codec* codec, const uint8_t* frame, size_t size, void* out,
                                    size_t capacity, size_t* decoded_size) {
    return guarded("mnn_h2o_codec_decode", [&]() -> mnn_h2o_status {
        const char* where = "mnn_h2o_codec_decode";
        if (decoded_size) *decoded_size = 0;
        if (!codec) return null_arg(where, "codec");
        if (!frame && size) return null_arg(where, "frame");
        if (!out && capacity) return null_arg(where, "out");
        mnn_h2o::gear::FrameInfo fi;
        const Status s = codec->codec.decode(frame, size, out, capacity, &fi);
        if (s != Status::Ok) return from_codec(where, s);
        if (decoded_size) *decoded_size = fi.decoded_size;
        return MNN_H2O_OK;
    });
}

int mnn_h2o_zstd_available(void) { return mnn_h2o::gear::zstd_available() ? 1 : 0; }

}  // extern "C"
