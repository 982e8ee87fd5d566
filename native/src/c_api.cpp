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
#include <vector>

#include "codec/gear_kernels.h"
#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/eviction/h2o_config.h"
#include "mnn_h2o/eviction/h2o_state.h"
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

bool valid_elem(mnn_h2o_elem_type t) {
    return t == MNN_H2O_ELEM_F16 || t == MNN_H2O_ELEM_BF16 || t == MNN_H2O_ELEM_F32;
}

mnn_h2o::gear::EncodeOptions to_options(const mnn_h2o_codec_options& o) {
    mnn_h2o::gear::EncodeOptions e;
    e.predictors = o.predictors;
    e.allow_rle = o.allow_rle != 0;
    e.allow_zstd = o.allow_zstd != 0;
    e.zstd_level = o.zstd_level;
    e.block_tokens = o.block_tokens;
    e.dedup = o.dedup != 0;
    return e;
}

// The one copy between the C struct and H2oConfig (field names are the config keys h2o.*); the
// strings of the C struct are policy and layer_budget, which must outlive it.
void to_c(const mnn_h2o::H2oConfig& c, const char* policy, const char* layer_budget, mnn_h2o_eviction_config* out) {
    out->policy = policy;
    out->sink_tokens = c.sink_tokens;
    out->recent_tokens = c.recent_tokens;
    out->target_keep_ratio = c.target_keep_ratio;
    out->target_lossy_ratio = c.target_lossy_ratio;
    out->ema_alpha = c.ema_alpha;
    out->layer_start = c.layer_start;
    out->layer_end = c.layer_end;
    out->trigger_min_tokens = c.trigger_min_tokens;
    out->update_interval = c.update_interval;
    out->per_head_budget = c.per_head_budget ? 1 : 0;
    out->seed = c.seed;
    out->max_floor_share = c.max_floor_share;
    out->kv_budget_bytes = c.kv_budget_bytes;
    out->observation_window = c.observation_window;
    out->head_floor_share = c.head_floor_share;
    out->layer_budget = layer_budget;
}

// NULL strings take the defaults.
mnn_h2o::H2oConfig from_c(const mnn_h2o_eviction_config& in) {
    mnn_h2o::H2oConfig c;
    if (in.policy) c.policy = in.policy;
    c.sink_tokens = in.sink_tokens;
    c.recent_tokens = in.recent_tokens;
    c.target_keep_ratio = in.target_keep_ratio;
    c.target_lossy_ratio = in.target_lossy_ratio;
    c.ema_alpha = in.ema_alpha;
    c.layer_start = in.layer_start;
    c.layer_end = in.layer_end;
    c.trigger_min_tokens = in.trigger_min_tokens;
    c.update_interval = in.update_interval;
    c.per_head_budget = in.per_head_budget != 0;
    c.seed = in.seed;
    c.max_floor_share = in.max_floor_share;
    c.kv_budget_bytes = in.kv_budget_bytes;
    c.observation_window = in.observation_window;
    c.head_floor_share = in.head_floor_share;
    if (in.layer_budget) c.layer_budget = in.layer_budget;
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
    if (!config) return;
    const mnn_h2o::KvCacheConfig d;
    config->n_layers = d.n_layers;
    config->n_kv_heads = d.n_kv_heads;
    config->n_heads = d.n_heads;
    config->head_dim = d.head_dim;
    config->dtype = static_cast<int32_t>(d.dtype);
    config->block_tokens = d.block_tokens;
    config->max_tokens = d.max_tokens;
    config->threads = d.threads;
}

mnn_h2o_status mnn_h2o_kv_cache_create(const mnn_h2o_kv_config* config, mnn_h2o_kv_cache** cache) {
    return guarded("mnn_h2o_kv_cache_create", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_create", "cache");
        *cache = nullptr;
        if (!config) return null_arg("mnn_h2o_kv_cache_create", "config");
        if (!mnn_h2o::kv_dtype_valid(config->dtype))
            return fail(MNN_H2O_ERR_INVALID_ARGUMENT, "mnn_h2o_kv_cache_create",
                        "unknown dtype " + std::to_string(config->dtype) + " (known: " + mnn_h2o::kv_dtype_names() + ")");
        mnn_h2o::KvCacheConfig c;
        c.n_layers = config->n_layers;
        c.n_kv_heads = config->n_kv_heads;
        c.n_heads = config->n_heads;
        c.head_dim = config->head_dim;
        c.dtype = static_cast<mnn_h2o::KvDtype>(config->dtype);
        c.block_tokens = config->block_tokens;
        c.max_tokens = config->max_tokens;
        c.threads = config->threads;
        *cache = new mnn_h2o_kv_cache(c);
        return MNN_H2O_OK;
    });
}

void mnn_h2o_kv_cache_destroy(mnn_h2o_kv_cache* cache) { delete cache; }

mnn_h2o_status mnn_h2o_kv_cache_get_config(const mnn_h2o_kv_cache* cache, mnn_h2o_kv_config* config) {
    return guarded("mnn_h2o_kv_cache_get_config", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_get_config", "cache");
        if (!config) return null_arg("mnn_h2o_kv_cache_get_config", "config");
        const mnn_h2o::KvCacheConfig& c = cache->cache.config();
        config->n_layers = c.n_layers;
        config->n_kv_heads = c.n_kv_heads;
        config->n_heads = c.n_heads;
        config->head_dim = c.head_dim;
        config->dtype = static_cast<int32_t>(c.dtype);
        config->block_tokens = c.block_tokens;
        config->max_tokens = c.max_tokens;
        config->threads = c.threads;
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_append(mnn_h2o_kv_cache* cache, int32_t layer, const float* k, const float* v,
                                       int32_t n_tokens) {
    return guarded("mnn_h2o_kv_cache_append", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_append", "cache");
        cache->cache.append(layer, k, v, n_tokens);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_attend(mnn_h2o_kv_cache* cache, int32_t layer, const float* q, int32_t n_q,
                                       float* out, float* block_scores, size_t scores_stride) {
    return guarded("mnn_h2o_kv_cache_attend", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_attend", "cache");
        cache->cache.attend(layer, q, n_q, out, block_scores, scores_stride);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_step(mnn_h2o_kv_cache* cache, int32_t layer, const float* q, const float* k,
                                     const float* v, int32_t n_tokens, float* out, float* block_scores,
                                     size_t scores_stride) {
    return guarded("mnn_h2o_kv_cache_step", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_step", "cache");
        cache->cache.step(layer, q, k, v, n_tokens, out, block_scores, scores_stride);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_length(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                       int32_t* length) {
    return guarded("mnn_h2o_kv_cache_length", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_length", "cache");
        if (!length) return null_arg("mnn_h2o_kv_cache_length", "length");
        *length = cache->cache.length(layer, head);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_read(const mnn_h2o_kv_cache* cache, int32_t layer, int32_t head, float* k_out,
                                     float* v_out) {
    return guarded("mnn_h2o_kv_cache_read", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_read", "cache");
        if (!k_out || !v_out) return null_arg("mnn_h2o_kv_cache_read", !k_out ? "k_out" : "v_out");
        cache->cache.read(layer, head, k_out, v_out);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_truncate(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head, int32_t n_tokens) {
    return guarded("mnn_h2o_kv_cache_truncate", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_truncate", "cache");
        cache->cache.truncate(layer, head, n_tokens);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_reset(mnn_h2o_kv_cache* cache) {
    return guarded("mnn_h2o_kv_cache_reset", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_reset", "cache");
        cache->cache.reset();
        return MNN_H2O_OK;
    });
}

size_t mnn_h2o_kv_cache_bytes_held(const mnn_h2o_kv_cache* cache) { return cache ? cache->cache.bytes_held() : 0; }

size_t mnn_h2o_kv_cache_bytes_mapped(const mnn_h2o_kv_cache* cache) {
    return cache ? cache->cache.bytes_mapped() : 0;
}

int32_t mnn_h2o_kv_cache_max_blocks(const mnn_h2o_kv_cache* cache) { return cache ? cache->cache.max_blocks() : 0; }

// ---- H2O eviction ------------------------------------------------------------------------------

const char* mnn_h2o_policy_name(int32_t i) {
    const std::vector<std::string>& names = mnn_h2o::policy_list();
    return i >= 0 && static_cast<size_t>(i) < names.size() ? names[static_cast<size_t>(i)].c_str() : nullptr;
}

void mnn_h2o_eviction_config_init(mnn_h2o_eviction_config* config) {
    if (!config) return;
    static_assert(mnn_h2o::kSkipReasons == 4, "mnn_h2o_eviction_layer_stats.skipped has 4 entries");
    // H2oConfig's defaults are the config schema's; the strings are its (static) literals.
    to_c(mnn_h2o::H2oConfig{}, mnn_h2o::schema::h2o::policy::kDefault, mnn_h2o::schema::h2o::layer_budget::kDefault,
         config);
}

mnn_h2o_status mnn_h2o_kv_cache_enable_h2o(mnn_h2o_kv_cache* cache, const mnn_h2o_eviction_config* config) {
    return guarded("mnn_h2o_kv_cache_enable_h2o", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_enable_h2o", "cache");
        if (!config) return null_arg("mnn_h2o_kv_cache_enable_h2o", "config");
        cache->cache.enable_h2o(from_c(*config));
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_disable_h2o(mnn_h2o_kv_cache* cache) {
    return guarded("mnn_h2o_kv_cache_disable_h2o", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_disable_h2o", "cache");
        cache->cache.disable_h2o();
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_get_h2o_config(const mnn_h2o_kv_cache* cache, mnn_h2o_eviction_config* config) {
    return guarded("mnn_h2o_kv_cache_get_h2o_config", [&]() -> mnn_h2o_status {
        const char* where = "mnn_h2o_kv_cache_get_h2o_config";
        if (!cache) return null_arg(where, "cache");
        if (!config) return null_arg(where, "config");
        const mnn_h2o::H2oConfig* c = cache->cache.h2o_config();
        if (!c) return fail(MNN_H2O_ERR_INVALID_ARGUMENT, where, "eviction is off");
        to_c(*c, c->policy.c_str(), c->layer_budget.c_str(), config);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_end_step(mnn_h2o_kv_cache* cache, int32_t n_tokens, int32_t prefill,
                                         int32_t* evicted) {
    return guarded("mnn_h2o_kv_cache_end_step", [&]() -> mnn_h2o_status {
        if (evicted) *evicted = 0;
        if (!cache) return null_arg("mnn_h2o_kv_cache_end_step", "cache");
        const bool any = cache->cache.end_step(n_tokens, prefill != 0);
        if (evicted) *evicted = any ? 1 : 0;
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_evict(mnn_h2o_kv_cache* cache, int32_t layer, int32_t head,
                                      const mnn_h2o_token_run* runs, size_t n_runs) {
    return guarded("mnn_h2o_kv_cache_evict", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_evict", "cache");
        if (!runs && n_runs) return null_arg("mnn_h2o_kv_cache_evict", "runs");
        std::vector<mnn_h2o::TokenRun> plan(n_runs);
        for (size_t i = 0; i < n_runs; ++i) {
            plan[i].offset = runs[i].offset;
            plan[i].length = runs[i].length;
        }
        cache->cache.evict(layer, head, plan);
        return MNN_H2O_OK;
    });
}

mnn_h2o_status mnn_h2o_kv_cache_h2o_stats(const mnn_h2o_kv_cache* cache, mnn_h2o_eviction_stats* stats) {
    return guarded("mnn_h2o_kv_cache_h2o_stats", [&]() -> mnn_h2o_status {
        if (!cache) return null_arg("mnn_h2o_kv_cache_h2o_stats", "cache");
        if (!stats) return null_arg("mnn_h2o_kv_cache_h2o_stats", "stats");
        const mnn_h2o::H2oStats st = cache->cache.h2o_stats();
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

mnn_h2o_status mnn_h2o_kv_cache_h2o_layer_stats(const mnn_h2o_kv_cache* cache, int32_t layer,
                                                mnn_h2o_eviction_layer_stats* stats) {
    return guarded("mnn_h2o_kv_cache_h2o_layer_stats", [&]() -> mnn_h2o_status {
        const char* where = "mnn_h2o_kv_cache_h2o_layer_stats";
        if (!cache) return null_arg(where, "cache");
        if (!stats) return null_arg(where, "stats");
        const mnn_h2o::H2oStats st = cache->cache.h2o_stats();
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

mnn_h2o_status mnn_h2o_kv_cache_h2o_scores(const mnn_h2o_kv_cache* cache, int32_t layer, float* scores,
                                           size_t capacity, int32_t* n_blocks) {
    return guarded("mnn_h2o_kv_cache_h2o_scores", [&]() -> mnn_h2o_status {
        const char* where = "mnn_h2o_kv_cache_h2o_scores";
        if (!cache) return null_arg(where, "cache");
        if (!n_blocks) return null_arg(where, "n_blocks");
        int nb = 0;
        const std::vector<float> s = cache->cache.h2o_scores(layer, &nb);
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
    if (!options) return;
    const mnn_h2o::gear::EncodeOptions d;
    options->predictors = d.predictors;
    options->allow_rle = d.allow_rle ? 1 : 0;
    options->allow_zstd = d.allow_zstd ? 1 : 0;
    options->zstd_level = d.zstd_level;
    options->block_tokens = d.block_tokens;
    options->dedup = d.dedup ? 1 : 0;
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
        *codec = new mnn_h2o_codec(to_options(o));
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
