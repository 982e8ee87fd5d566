// One file: KvCache is one pybind11 class, bound with the converters only it uses.
// Python face of mnn_h2o::KvCache: numpy arrays in and out, checked before any native code sees
// them, with the GIL released while the kernels run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/eviction/h2o_config.h"
#include "mnn_h2o/eviction/h2o_state.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/store/kv_store.h"
#include "mnn_h2o/store/store_config.h"

namespace py = pybind11;
using mnn_h2o::H2oConfig;
using mnn_h2o::H2oStats;
using mnn_h2o::Isa;
using mnn_h2o::KvCache;
using mnn_h2o::KvCacheConfig;
using mnn_h2o::KvDtype;
using mnn_h2o::StoreConfig;
using mnn_h2o::StoreMode;
using mnn_h2o::StoreStats;

namespace {

KvDtype parse_dtype(const std::string& name) {
    KvDtype dtype;
    if (!mnn_h2o::kv_dtype_from_name(name, &dtype))
        throw py::value_error("dtype must be one of " + mnn_h2o::kv_dtype_names() + ", got '" + name + "'");
    return dtype;
}

Isa parse_isa(const py::object& name) {
    if (name.is_none()) return mnn_h2o::best_isa();
    const std::string s = py::str(name);
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
        if (s == mnn_h2o::isa_name(isa)) return isa;
    throw py::value_error("isa must be 'scalar', 'avx2', 'avx512' or 'neon', got '" + s + "'");
}

// obj as a float32, C-contiguous, aligned (and if asked, writeable) numpy array: what the native
// code may read (and write) as plain floats. kind names what obj may be in the error. The messages
// are made only on failure: step() converts four arrays per layer and token.
py::array float_array(const py::object& obj, const char* name, bool writable, const char* kind = "a numpy.ndarray") {
    if (!py::isinstance<py::array>(obj)) throw py::value_error(std::string(name) + " must be " + kind);
    py::array a = py::reinterpret_borrow<py::array>(obj);
    const auto fail = [name](const std::string& what) { throw py::value_error(std::string(name) + ": " + what); };
    if (!a.dtype().is(py::dtype::of<float>())) fail("dtype must be float32, got " + std::string(py::str(a.dtype())));
    if (!(a.flags() & py::array::c_style)) fail("must be C-contiguous");
    if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float)) fail("must be aligned");
    if (writable && !a.writeable()) fail("must be writeable");
    return a;
}

// A float_array of [n, heads*dim] or [n, heads, dim]; returns n.
py::array float_rows(const py::object& obj, const char* name, int heads, int dim, bool writable, int* n_rows) {
    py::array a = float_array(obj, name, writable);
    const bool ok = (a.ndim() == 2 && a.shape(1) == heads * dim) ||
                    (a.ndim() == 3 && a.shape(1) == heads && a.shape(2) == dim);
    if (!ok)
        throw py::value_error(std::string(name) + ": shape must be [n, " + std::to_string(heads * dim) + "] or [n, " +
                              std::to_string(heads) + ", " + std::to_string(dim) + "], got " +
                              std::string(py::str(a.attr("shape"))));
    if (a.shape(0) > INT32_MAX) throw py::value_error(std::string(name) + ": too many rows");
    *n_rows = static_cast<int>(a.shape(0));
    return a;
}

// Optional block-score accumulator: a writeable float_array [n_kv_heads, width]; returns (ptr, width).
float* scores_array(const py::object& obj, int n_kv_heads, size_t* stride) {
    *stride = 0;
    if (obj.is_none()) return nullptr;
    py::array a = float_array(obj, "scores", true, "a numpy.ndarray or None");
    if (a.ndim() != 2 || a.shape(0) != n_kv_heads || a.shape(1) < 1)
        throw py::value_error("scores: shape must be [" + std::to_string(n_kv_heads) + ", max_blocks], got " +
                              std::string(py::str(a.attr("shape"))));
    *stride = static_cast<size_t>(a.shape(1));
    return static_cast<float*>(a.mutable_data());
}

// An eviction plan from Python: a sequence of (offset, length) pairs of ints.
std::vector<mnn_h2o::TokenRun> token_runs(const py::object& obj) {
    if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj))
        throw py::value_error("runs must be a sequence of (offset, length) pairs");
    std::vector<mnn_h2o::TokenRun> runs;
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    for (size_t i = 0; i < seq.size(); ++i) {
        const py::object item = seq[i];
        const std::string where = "runs[" + std::to_string(i) + "]";
        if (!py::isinstance<py::sequence>(item) || py::len(item) != 2)
            throw py::value_error(where + " must be an (offset, length) pair");
        const py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
        mnn_h2o::TokenRun r;
        try {
            r.offset = py::int_(pair[0].attr("__index__")()).cast<int64_t>();
            r.length = py::int_(pair[1].attr("__index__")()).cast<int64_t>();
        } catch (const py::error_already_set&) {
            throw py::value_error(where + " must hold two ints");
        } catch (const py::cast_error&) {
            throw py::value_error(where + " is out of range");
        }
        runs.push_back(r);
    }
    return runs;
}

py::dict stats_dict(const H2oStats& s) {
    py::list layers;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const H2oStats::Layer& l = s.layers[i];
        py::dict skipped;
        for (int r = 0; r < mnn_h2o::kSkipReasons; ++r)
            skipped[mnn_h2o::skip_reason_name(static_cast<mnn_h2o::SkipReason>(r))] = l.counters.skipped[r];
        py::dict d;
        d["layer"] = i;
        d["tokens_seen"] = l.counters.tokens_seen;
        d["held"] = l.held;
        d["bytes_held"] = l.bytes_held;
        d["evictions"] = l.counters.evictions;
        d["blocks_freed"] = l.counters.blocks_freed;
        d["policy_us"] = l.counters.policy_us;
        d["compact_us"] = l.counters.compact_us;
        d["skipped"] = skipped;
        d["invalid_plans"] = l.counters.invalid_plans;
        layers.append(d);
    }
    py::dict d;
    d["layers"] = layers;
    d["bytes_held"] = s.bytes_held;
    d["bytes_uncompressed"] = s.bytes_uncompressed;
    d["lossy_ratio"] = s.lossy_ratio;
    d["bytes_f16"] = s.bytes_f16;
    d["whole_model_ratio"] = s.whole_model_ratio;
    d["policy_us"] = s.policy_us;
    d["compact_us"] = s.compact_us;
    d["updates"] = s.updates;
    return d;
}

py::dict config_dict(const H2oConfig& c) {
    py::dict d;
    d["policy"] = c.policy;
    d["sink_tokens"] = c.sink_tokens;
    d["recent_tokens"] = c.recent_tokens;
    d["max_floor_share"] = c.max_floor_share;
    d["target_keep_ratio"] = c.target_keep_ratio;
    d["target_lossy_ratio"] = c.target_lossy_ratio;
    d["ema_alpha"] = c.ema_alpha;
    d["layer_start"] = c.layer_start;
    d["layer_end"] = c.layer_end;
    d["trigger_min_tokens"] = c.trigger_min_tokens;
    d["update_interval"] = c.update_interval;
    d["per_head_budget"] = c.per_head_budget;
    d["seed"] = c.seed;
    d["observation_window"] = c.observation_window;
    d["head_floor_share"] = c.head_floor_share;
    d["layer_budget"] = c.layer_budget;
    d["kv_budget_bytes"] = c.kv_budget_bytes;
    return d;
}

// A name of the schema's choices of K (the native enums follow their order) as enum E.
template <class K, class E>
E parse_choice(const char* where, const std::string& name) {
    const int i = mnn_h2o::schema::choice_index<K>(name);
    if (i < 0) throw py::value_error(std::string(where) + ": " + K::kName + " must be " + K::kAllowed + ", got '" + name + "'");
    return static_cast<E>(i);
}

// A Python int as the C++ type of its field; one that does not fit is a ValueError naming the
// argument (the bounds themselves are the native validation's).
template <class T>
T narrow(const char* where, const char* name, long long x) {
    const bool fits = x >= 0 ? static_cast<unsigned long long>(x) <= static_cast<unsigned long long>(std::numeric_limits<T>::max())
                             : std::numeric_limits<T>::is_signed && x >= static_cast<long long>(std::numeric_limits<T>::min());
    if (!fits) throw py::value_error(std::string(where) + ": " + name + " is out of range, got " + std::to_string(x));
    return static_cast<T>(x);
}

py::dict store_counters_dict(const mnn_h2o::StoreLayerStats& c) {
    py::dict fallbacks;
    for (int r = 0; r < mnn_h2o::kStoreFallbacks; ++r)
        fallbacks[mnn_h2o::store_fallback_name(static_cast<mnn_h2o::StoreFallback>(r))] = c.fallbacks[r];
    py::dict d;
    d["chunks_encoded"] = c.chunks_encoded;
    d["chunks_stored"] = c.chunks_stored;
    d["raw_bytes"] = c.raw_bytes;
    d["compressed_bytes"] = c.compressed_bytes;
    d["stored_raw_bytes"] = c.stored_raw_bytes;
    d["stored_blob_bytes"] = c.stored_blob_bytes;
    d["encode_us"] = c.encode_us;
    d["verify_us"] = c.verify_us;
    d["decode_us"] = c.decode_us;
    d["verify_mismatches"] = c.verify_mismatches;
    d["cache_hits"] = c.cache_hits;
    d["cache_misses"] = c.cache_misses;
    d["dissolved"] = c.dissolved;
    d["repacked"] = c.repacked;
    d["merged"] = c.merged;
    d["decode_batches"] = c.decode_batches;
    d["fallbacks"] = fallbacks;
    return d;
}

py::dict store_stats_dict(const StoreStats& s) {
    py::list layers;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        py::dict d = store_counters_dict(s.layers[i].counters);
        d["layer"] = i;
        d["chunks_held"] = s.layers[i].chunks_held;
        d["blob_bytes"] = s.layers[i].blob_bytes;
        d["table_bytes"] = s.layers[i].table_bytes;
        d["held_raw_bytes"] = s.layers[i].held_raw_bytes;
        layers.append(d);
    }
    py::dict d = store_counters_dict(s.total);
    d["mode"] = mnn_h2o::store_mode_name(s.mode);
    d["layers"] = layers;
    d["lossless_ratio"] = s.lossless_ratio;
    d["async_wait_us"] = s.async_wait_us;
    d["queue_peak"] = s.queue_peak;
    d["deferrals"] = s.deferrals;
    d["stale_jobs"] = s.stale_jobs;
    d["chunks_held"] = s.chunks_held;
    d["blob_bytes"] = s.blob_bytes;
    d["table_bytes"] = s.table_bytes;
    d["held_raw_bytes"] = s.held_raw_bytes;
    d["cache_bytes"] = s.cache_bytes;
    d["scratch_bytes"] = s.scratch_bytes;
    d["pool_bytes"] = s.pool_bytes;
    d["bytes_held"] = s.bytes_held;
    d["bytes_uncompressed"] = s.bytes_uncompressed;
    d["total_ratio"] = s.total_ratio;
    return d;
}

py::dict store_config_dict(const StoreConfig& c) {
    py::dict d;
    d["mode"] = mnn_h2o::store_mode_name(c.mode);
    d["scope"] = mnn_h2o::store_scope_name(c.scope);
    d["front_n"] = c.front_n;
    d["hot_sink_tokens"] = c.hot_sink_tokens;
    d["hot_recent_tokens"] = c.hot_recent_tokens;
    d["chunk_tokens"] = c.chunk_tokens;
    d["v_dedup_layers"] = c.v_dedup_layers;
    d["async_threads"] = c.async_threads;
    d["max_queue"] = c.max_queue;
    d["decode_cache_bytes"] = c.decode_cache_bytes;
    d["prefetch"] = c.prefetch;
    d["zstd_level"] = c.zstd_level;
    d["probe_every"] = c.probe_every;
    return d;
}

// The cache plus a lock: the GIL is released during native work, so two Python threads could
// otherwise enter one cache at once.
struct PyKvCache {
    explicit PyKvCache(const KvCacheConfig& config) : cache(config) {}
    KvCache cache;
    std::mutex mutex;
};

// Scope of one native call: releases the GIL, then takes the cache lock (in that order, so a
// thread never waits for the cache while holding the GIL); undone in reverse.
class NativeCall {
public:
    explicit NativeCall(PyKvCache& c) : lock_(c.mutex) {}

private:
    py::gil_scoped_release release_;
    std::lock_guard<std::mutex> lock_;
};

// A KvCache method as a binding that calls it inside a NativeCall. The result is converted after
// the call returns, with the GIL held again: h2o_stats() and store_stats() build their dicts
// from the copy it returns.
template <class R, class... Args, class Method>
auto locked_call(Method method) {
    return [method](PyKvCache& self, Args... args) -> R {
        NativeCall call(self);
        return (self.cache.*method)(args...);
    };
}
template <class R, class... Args>
auto locked(R (KvCache::*method)(Args...)) { return locked_call<R, Args...>(method); }
template <class R, class... Args>
auto locked(R (KvCache::*method)(Args...) const) { return locked_call<R, Args...>(method); }

// The config get() returns, copied inside a NativeCall, as a dict; None when it returns null (that
// part of the cache is off).
template <class Config>
py::object active_config(PyKvCache& self, const Config* (KvCache::*get)() const, py::dict (*to_dict)(const Config&)) {
    std::optional<Config> c;
    {
        NativeCall call(self);
        if (const Config* active = (self.cache.*get)()) c = *active;
    }
    return c ? py::object(to_dict(*c)) : py::none();
}

}  // namespace

void bind_kv_cache(py::module_& m) {
    // The keyword defaults of the constructor, enable_h2o and enable_store: the native structs'
    // own, which are the config schema's (config_schema.h).
    const KvCacheConfig kCache;
    const H2oConfig kH2o;
    const StoreConfig kStore;
    // Native exceptions map to Python ones: invalid_argument/length_error -> ValueError,
    // out_of_range -> IndexError, bad_alloc -> MemoryError (pybind11's defaults).
    m.def("best_isa", [] { return std::string(mnn_h2o::isa_name(mnn_h2o::best_isa())); },
          "Widest SIMD kernel set compiled in and supported by this CPU (capped by MNN_H2O_ISA).");
    m.def(
        "available_isas",
        [] {
            std::vector<std::string> names;
            for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
                if (mnn_h2o::isa_available(isa)) names.emplace_back(mnn_h2o::isa_name(isa));
            return names;
        },
        "Every kernel set that can run here (for tests and benchmarks).");
    m.def(
        "kv_dtypes",
        [] {
            std::vector<std::string> names;
            for (int i = 0; i < mnn_h2o::kKvDtypeCount; ++i)
                names.emplace_back(mnn_h2o::kv_dtype_name(static_cast<KvDtype>(i)));
            return names;
        },
        "Names of the KV element types, in the native order (docs/kv_cache.md \"Row formats\").");
    m.def("policy_names", [] { return mnn_h2o::policy_list(); },
          "Names of the eviction policies, from the native registry (docs/h2o.md \"Policies\").");
    m.def(
        "kv_row_bytes",
        [](const std::string& dtype, int head_dim) {
            const KvDtype dt = parse_dtype(dtype);
            const std::string error = mnn_h2o::kv_dtype_shape_error(dt, head_dim);
            if (!error.empty()) throw py::value_error(error);
            return mnn_h2o::kv_row_bytes(dt, head_dim);
        },
        py::arg("dtype"), py::arg("head_dim"), "Bytes of one cached K or V row of head_dim elements, scales included.");
    m.def(
        "kv_rows_encode",
        [](const std::string& dtype, const py::array_t<float, py::array::c_style | py::array::forcecast>& rows) {
            const KvDtype dt = parse_dtype(dtype);
            if (rows.ndim() != 2) throw py::value_error("kv_rows_encode: rows must be 2-D [n, head_dim]");
            const int head_dim = static_cast<int>(rows.shape(1));
            const std::string error = mnn_h2o::kv_dtype_shape_error(dt, head_dim);
            if (!error.empty()) throw py::value_error(error);
            const py::ssize_t row_bytes = static_cast<py::ssize_t>(mnn_h2o::kv_row_bytes(dt, head_dim));
            py::array_t<uint8_t> out({rows.shape(0), row_bytes});
            mnn_h2o::kv_rows_from_f32(dt, rows.data(), out.mutable_data(), static_cast<size_t>(rows.shape(0)), head_dim);
            return out;
        },
        py::arg("dtype"), py::arg("rows"),
        "float32 rows [n, head_dim] in the cache's row format of dtype (docs/kv_cache.md \"Row formats\"; "
        "the rotation of the r types not applied), as uint8 [n, kv_row_bytes(dtype, head_dim)].");

    py::class_<PyKvCache>(m, "KvCache", R"doc(
Block-structured KV cache of all layers with its attention op.

k/v rows are float32 [n, n_kv_heads*head_dim] (or [n, n_kv_heads, head_dim]); q rows
[n, n_heads*head_dim] (or 3-D); out is a preallocated float32 [n, n_heads*head_dim] written in
place. scores, if given, is float32 [n_kv_heads, max_blocks] and accumulates (+=) the softmax
mass each key block received, summed over the queries and the query heads of each kv head.
)doc")
        .def(py::init([](int n_layers, int n_kv_heads, int head_dim, int n_heads, const std::string& dtype,
                         int block_tokens, int max_tokens, int threads) {
                 KvCacheConfig c;
                 c.n_layers = n_layers;
                 c.n_kv_heads = n_kv_heads;
                 c.head_dim = head_dim;
                 c.n_heads = n_heads;
                 c.dtype = parse_dtype(dtype);
                 c.block_tokens = block_tokens;
                 c.max_tokens = max_tokens;
                 c.threads = threads;
                 return new PyKvCache(c);
             }),
             // The defaults are KvCacheConfig's: dtype, block_tokens and threads the config schema's
             // (docs/config.md, runtime.kv_dtype, runtime.block_tokens, runtime.threads).
             py::arg("n_layers"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("n_heads"),
             py::arg("dtype") = mnn_h2o::kv_dtype_name(kCache.dtype), py::arg("block_tokens") = kCache.block_tokens,
             py::arg("max_tokens") = kCache.max_tokens, py::arg("threads") = kCache.threads)
        .def(
            "step",
            [](PyKvCache& self, int layer, const py::object& q, const py::object& k, const py::object& v,
               const py::object& out, const py::object& scores) {
                const KvCacheConfig& c = self.cache.config();
                int nq, nk, nv, no;
                py::array qa = float_rows(q, "q", c.n_heads, c.head_dim, false, &nq);
                py::array ka = float_rows(k, "k", c.n_kv_heads, c.head_dim, false, &nk);
                py::array va = float_rows(v, "v", c.n_kv_heads, c.head_dim, false, &nv);
                py::array oa = float_rows(out, "out", c.n_heads, c.head_dim, true, &no);
                if (nk != nq || nv != nq || no != nq)
                    throw py::value_error("step: q, k, v and out must have the same number of rows (got " +
                                          std::to_string(nq) + ", " + std::to_string(nk) + ", " + std::to_string(nv) +
                                          ", " + std::to_string(no) + ")");
                size_t stride;
                float* s = scores_array(scores, c.n_kv_heads, &stride);
                NativeCall call(self);
                self.cache.step(layer, static_cast<const float*>(qa.data()), static_cast<const float*>(ka.data()),
                                static_cast<const float*>(va.data()), nq, static_cast<float*>(oa.mutable_data()), s,
                                stride);
            },
            py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("scores") = py::none(),
            "Append the n new tokens' k, v to layer, then attend their queries q into out.")
        .def(
            "append",
            [](PyKvCache& self, int layer, const py::object& k, const py::object& v) {
                const KvCacheConfig& c = self.cache.config();
                int nk, nv;
                py::array ka = float_rows(k, "k", c.n_kv_heads, c.head_dim, false, &nk);
                py::array va = float_rows(v, "v", c.n_kv_heads, c.head_dim, false, &nv);
                if (nk != nv) throw py::value_error("append: k and v must have the same number of rows");
                NativeCall call(self);
                self.cache.append(layer, static_cast<const float*>(ka.data()), static_cast<const float*>(va.data()), nk);
            },
            py::arg("layer"), py::arg("k"), py::arg("v"))
        .def(
            "attend",
            [](PyKvCache& self, int layer, const py::object& q, const py::object& out, const py::object& isa,
               const py::object& scores) {
                const KvCacheConfig& c = self.cache.config();
                int nq, no;
                py::array qa = float_rows(q, "q", c.n_heads, c.head_dim, false, &nq);
                py::array oa = float_rows(out, "out", c.n_heads, c.head_dim, true, &no);
                if (no != nq) throw py::value_error("attend: q and out must have the same number of rows");
                const Isa kernel = parse_isa(isa);
                size_t stride;
                float* s = scores_array(scores, c.n_kv_heads, &stride);
                NativeCall call(self);
                self.cache.attend(layer, static_cast<const float*>(qa.data()), nq, static_cast<float*>(oa.mutable_data()),
                                  s, stride, kernel);
            },
            py::arg("layer"), py::arg("q"), py::arg("out"), py::arg("isa") = py::none(), py::arg("scores") = py::none(),
            "Attend queries q (the last n positions) over the cached tokens of layer into out.")
        .def("length", locked(&KvCache::length), py::arg("layer"), py::arg("head") = 0)
        .def("bytes_held", locked(&KvCache::bytes_held))
        .def("pool_bytes_held", locked(&KvCache::pool_bytes_held),
             "Bytes of raw KV blocks alone (bytes_held() adds the store's frames, cache and scratch).")
        .def("kept_bytes", locked(&KvCache::kept_bytes),
             "Bytes the held tokens would take as raw blocks, compressed or not (what eviction alone leaves).")
        .def("bytes_mapped", locked(&KvCache::bytes_mapped))
        .def(
            "read",
            [](PyKvCache& self, int layer, int head) {
                std::vector<float> k, v;
                {
                    NativeCall call(self);
                    const size_t n = static_cast<size_t>(self.cache.length(layer, head)) * self.cache.config().head_dim;
                    k.resize(n);
                    v.resize(n);
                    self.cache.read(layer, head, k.data(), v.data());
                }
                const py::ssize_t hd = self.cache.config().head_dim, len = static_cast<py::ssize_t>(k.size()) / hd;
                return py::make_tuple(py::array_t<float>({len, hd}, k.data()), py::array_t<float>({len, hd}, v.data()));
            },
            py::arg("layer"), py::arg("head"), "Copy of one head's cached K and V as float32 [length, head_dim].")
        .def("truncate", locked(&KvCache::truncate), py::arg("layer"), py::arg("head"), py::arg("n_tokens"),
             "Keep the first n_tokens of one head; blocks past them go back to the OS.")
        .def("reset", locked(&KvCache::reset))
        .def(
            "enable_h2o",
            [](PyKvCache& self, const std::string& policy, long long sink_tokens, long long recent_tokens,
               double target_keep_ratio, double target_lossy_ratio, double ema_alpha, long long layer_start,
               long long layer_end, long long trigger_min_tokens, long long update_interval, bool per_head_budget,
               long long seed, double max_floor_share, long long observation_window, double head_floor_share,
               const std::string& layer_budget, long long kv_budget_bytes) {
                // Types only: the values are checked by the native validation (the schema's bounds).
                const char* where = "enable_h2o";
                H2oConfig c;
                c.policy = policy;
                c.sink_tokens = narrow<int>(where, "sink_tokens", sink_tokens);
                c.recent_tokens = narrow<int>(where, "recent_tokens", recent_tokens);
                c.target_keep_ratio = target_keep_ratio;
                c.target_lossy_ratio = target_lossy_ratio;
                c.ema_alpha = ema_alpha;
                c.layer_start = narrow<int>(where, "layer_start", layer_start);
                c.layer_end = narrow<int>(where, "layer_end", layer_end);
                c.trigger_min_tokens = narrow<int>(where, "trigger_min_tokens", trigger_min_tokens);
                c.update_interval = narrow<int>(where, "update_interval", update_interval);
                c.per_head_budget = per_head_budget;
                c.seed = narrow<uint64_t>(where, "seed", seed);
                c.max_floor_share = max_floor_share;
                c.observation_window = narrow<int>(where, "observation_window", observation_window);
                c.head_floor_share = head_floor_share;
                c.layer_budget = layer_budget;
                c.kv_budget_bytes = kv_budget_bytes;
                NativeCall call(self);
                self.cache.enable_h2o(c);
            },
            // The defaults are H2oConfig's, i.e. the config schema's (docs/config.md, h2o.*).
            py::kw_only(), py::arg("policy") = kH2o.policy, py::arg("sink_tokens") = kH2o.sink_tokens,
            py::arg("recent_tokens") = kH2o.recent_tokens, py::arg("target_keep_ratio") = kH2o.target_keep_ratio,
            py::arg("target_lossy_ratio") = kH2o.target_lossy_ratio, py::arg("ema_alpha") = kH2o.ema_alpha,
            py::arg("layer_start") = kH2o.layer_start, py::arg("layer_end") = kH2o.layer_end,
            py::arg("trigger_min_tokens") = kH2o.trigger_min_tokens, py::arg("update_interval") = kH2o.update_interval,
            py::arg("per_head_budget") = kH2o.per_head_budget, py::arg("seed") = kH2o.seed,
            py::arg("max_floor_share") = kH2o.max_floor_share, py::arg("observation_window") = kH2o.observation_window,
            py::arg("head_floor_share") = kH2o.head_floor_share, py::arg("layer_budget") = kH2o.layer_budget,
            py::arg("kv_budget_bytes") = kH2o.kv_budget_bytes,
            R"doc(Turn H2O eviction on (or replace its settings; scores restart). See docs/h2o.md.
The arguments, their defaults and allowed values are the config keys h2o.* of docs/config.md
(target_keep_ratio or kv_budget_bytes > 0, at most one, replaces target_lossy_ratio;
layer_end -1 = n_layers). ValueError naming the bad argument.)doc")
        .def("disable_h2o", locked(&KvCache::disable_h2o), "Turn eviction off; the tokens held stay.")
        .def_property_readonly("h2o_enabled",
                               [](PyKvCache& self) {
                                   NativeCall call(self);
                                   return self.cache.h2o_config() != nullptr;
                               })
        .def(
            "h2o_config", [](PyKvCache& self) { return active_config(self, &KvCache::h2o_config, config_dict); },
            "The active H2O settings (layer_end resolved) as a dict, or None when eviction is off.")
        .def("end_step", locked(&KvCache::end_step), py::arg("n_tokens"), py::arg("prefill"),
            "Call once after all layers of a forward of n_tokens tokens; runs the eviction policy when due. "
            "True if anything was evicted.")
        .def(
            "evict",
            [](PyKvCache& self, int layer, int head, const py::object& runs) {
                const std::vector<mnn_h2o::TokenRun> plan = token_runs(runs);
                NativeCall call(self);
                self.cache.evict(layer, head, plan);
            },
            py::arg("layer"), py::arg("head"), py::arg("runs"),
            "Keep only the tokens of runs [(offset, length), ...] of one head (sorted, disjoint, covering the "
            "sink/recent floors and the last token); ValueError if invalid, and nothing changes.")
        .def(
            "h2o_stats",
            [](PyKvCache& self) { return stats_dict(locked(&KvCache::h2o_stats)(self)); },
            "Per-layer eviction counters and held tokens/bytes, and whole-model bytes_held, bytes_uncompressed, "
            "lossy_ratio (= uncompressed / held) and policy time.")
        .def(
            "block_scores",
            [](PyKvCache& self, int layer, bool reconstruction) {
                std::vector<float> scores;
                int n_blocks = 0;
                {
                    NativeCall call(self);
                    scores = self.cache.h2o_scores(layer, &n_blocks, reconstruction);
                }
                const py::ssize_t rows = self.cache.config().n_kv_heads;
                return py::array_t<float>({rows, static_cast<py::ssize_t>(n_blocks)}, scores.data());
            },
            py::arg("layer"), py::arg("reconstruction") = false,
            "Current EMA block scores of layer as float32 [n_kv_heads, n_blocks] (NaN: not held or not scored yet); "
            "reconstruction=True: the reconstruction scores (kvzip) instead.")
        .def_property_readonly("h2o_reconstructs", locked(&KvCache::h2o_reconstructs),
                               "Whether the eviction policy scores blocks by a context reconstruction pass (kvzip).")
        .def_property_readonly("reconstructing", locked(&KvCache::reconstructing),
                               "Whether a reconstruction pass is under way.")
        .def("begin_reconstruction", locked(&KvCache::begin_reconstruction),
             "Start a context reconstruction pass: the tokens stepped from now on are the pass's; the evicting "
             "layers collect each block's peak probability. ValueError unless h2o_reconstructs.")
        .def("rewind_reconstruction", locked(&KvCache::rewind_reconstruction),
             "Drop every token stepped since begin_reconstruction (their memory is freed); the pass goes on.")
        .def("end_reconstruction", locked(&KvCache::end_reconstruction),
             "Rewind, fold the pass's peaks into the blocks' reconstruction scores (max), end the pass.")
        .def(
            "enable_store",
            [](PyKvCache& self, const std::string& mode, const std::string& scope, long long front_n,
               long long hot_sink_tokens, long long hot_recent_tokens, long long chunk_tokens, long long v_dedup_layers,
               long long async_threads, long long max_queue, long long decode_cache_bytes, bool prefetch,
               long long zstd_level, long long probe_every, const std::vector<std::string>& faults) {
                // Types only: the values are checked by the native validation (the schema's bounds).
                const char* where = "enable_store";
                StoreConfig c;
                c.mode = parse_choice<mnn_h2o::schema::lossless::mode, StoreMode>(where, mode);
                c.scope = parse_choice<mnn_h2o::schema::lossless::scope, mnn_h2o::StoreScope>(where, scope);
                c.front_n = narrow<int>(where, "front_n", front_n);
                c.hot_sink_tokens = narrow<int>(where, "hot_sink_tokens", hot_sink_tokens);
                c.hot_recent_tokens = narrow<int>(where, "hot_recent_tokens", hot_recent_tokens);
                c.chunk_tokens = narrow<int>(where, "chunk_tokens", chunk_tokens);
                c.v_dedup_layers = narrow<int>(where, "v_dedup_layers", v_dedup_layers);
                c.async_threads = narrow<int>(where, "async_threads", async_threads);
                c.max_queue = narrow<int>(where, "max_queue", max_queue);
                c.decode_cache_bytes = narrow<size_t>(where, "decode_cache_bytes", decode_cache_bytes);
                c.prefetch = prefetch;
                c.zstd_level = narrow<int>(where, "zstd_level", zstd_level);
                c.probe_every = narrow<int>(where, "probe_every", probe_every);
                for (const std::string& f : faults) {
                    if (f == "encode_error") c.faults.encode_error = true;
                    else if (f == "verify_mismatch") c.faults.verify_mismatch = true;
                    else if (f == "alloc_failure") c.faults.alloc_failure = true;
                    else if (f == "worker_exception") c.faults.worker_exception = true;
                    else throw py::value_error("enable_store: faults: unknown fault '" + f + "'");
                }
                NativeCall call(self);
                self.cache.enable_store(c);
            },
            // The defaults are StoreConfig's, i.e. the config schema's (docs/config.md, lossless.*).
            py::kw_only(), py::arg("mode") = mnn_h2o::store_mode_name(kStore.mode),
            py::arg("scope") = mnn_h2o::store_scope_name(kStore.scope), py::arg("front_n") = kStore.front_n,
            py::arg("hot_sink_tokens") = kStore.hot_sink_tokens, py::arg("hot_recent_tokens") = kStore.hot_recent_tokens,
            py::arg("chunk_tokens") = kStore.chunk_tokens, py::arg("v_dedup_layers") = kStore.v_dedup_layers,
            py::arg("async_threads") = kStore.async_threads, py::arg("max_queue") = kStore.max_queue,
            py::arg("decode_cache_bytes") = kStore.decode_cache_bytes, py::arg("prefetch") = kStore.prefetch,
            py::arg("zstd_level") = kStore.zstd_level, py::arg("probe_every") = kStore.probe_every,
            py::arg("faults") = std::vector<std::string>(),
            R"doc(Turn the lossless store on (mode 'probe', 'full' or 'store'; 'off' turns it off), or replace
its settings (what is compressed is dissolved back to raw first). See docs/kv_cache.md.
The arguments but faults, their defaults and allowed values are the config keys lossless.* of
docs/config.md. faults (tests only): any of 'encode_error', 'verify_mismatch', 'alloc_failure',
'worker_exception'. ValueError naming the bad argument.)doc")
        .def("disable_store", locked(&KvCache::disable_store),
             "Dissolve every compressed chunk back to raw blocks and stop the store's workers.")
        .def(
            "store_config",
            [](PyKvCache& self) { return active_config(self, &KvCache::store_config, store_config_dict); },
            "The active store settings as a dict, or None when the store is off.")
        .def(
            "store_stats",
            [](PyKvCache& self) { return store_stats_dict(locked(&KvCache::store_stats)(self)); },
            "Store counters (whole model and per layer) and bytes: pool_bytes + blob_bytes + table_bytes + "
            "cache_bytes + scratch_bytes = bytes_held; total_ratio = bytes_uncompressed / bytes_held.")
        .def("drain_store", locked(&KvCache::drain_store),
             "Wait for every store job under way and install it.")
        .def(
            "snapshot",
            [](PyKvCache& self) {
                std::vector<uint8_t> bytes = locked(&KvCache::snapshot)(self);
                return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
            },
            "The cache as it is held, as bytes (docs/session_format.md \"KVCS\"). ValueError with the "
            "lossless store on.")
        .def(
            "restore",
            [](PyKvCache& self, const py::bytes& data) {
                const std::string_view view(data);  // the bytes object stays alive for the call
                NativeCall call(self);
                self.cache.restore(reinterpret_cast<const uint8_t*>(view.data()), view.size());
            },
            py::arg("data"),
            "Replace the contents by a snapshot() of a cache of the same shape, dtype and H2O config "
            "(store off). ValueError naming what does not match or decode; the cache is unchanged then.")
        .def_property_readonly("n_layers", [](const PyKvCache& s) { return s.cache.config().n_layers; })
        .def_property_readonly("n_kv_heads", [](const PyKvCache& s) { return s.cache.config().n_kv_heads; })
        .def_property_readonly("head_dim", [](const PyKvCache& s) { return s.cache.config().head_dim; })
        .def_property_readonly("n_heads", [](const PyKvCache& s) { return s.cache.config().n_heads; })
        .def_property_readonly("group", [](const PyKvCache& s) { return s.cache.group(); })
        .def_property_readonly("dtype", [](const PyKvCache& s) { return std::string(mnn_h2o::kv_dtype_name(s.cache.config().dtype)); })
        .def_property_readonly("block_tokens", [](const PyKvCache& s) { return s.cache.config().block_tokens; })
        .def_property_readonly("max_tokens", [](const PyKvCache& s) { return s.cache.config().max_tokens; })
        .def_property_readonly("max_blocks", [](const PyKvCache& s) { return s.cache.max_blocks(); })
        .def_property_readonly("threads", [](const PyKvCache& s) { return s.cache.config().threads; });
}
