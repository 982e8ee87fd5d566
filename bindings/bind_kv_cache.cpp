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
#include <type_traits>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/eviction/eviction_config.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/cache/kv_cache.h"
#include "mnn_h2o/store/lossless_stage.h"
#include "mnn_h2o/store/store_config.h"
#include "isa_arg.h"
#include "py_kv_cache.h"

namespace py = pybind11;
using mnn_h2o::EvictionConfig;
using mnn_h2o::EvictionStats;
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
    if (!mnn_h2o::enum_from_name(name, &dtype))
        throw py::value_error("dtype must be one of " + mnn_h2o::enum_names_text<KvDtype>() + ", got '" + name + "'");
    return dtype;
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

py::dict stats_dict(const EvictionStats& s) {
    py::list layers;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const EvictionStats::Layer& l = s.layers[i];
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

// A Python int as the C++ type of its field; one that does not fit is a ValueError naming the
// argument (the bounds themselves are the native validation's).
template <class T>
T narrow(const char* where, const char* name, long long x) {
    const bool fits = x >= 0 ? static_cast<unsigned long long>(x) <= static_cast<unsigned long long>(std::numeric_limits<T>::max())
                             : std::numeric_limits<T>::is_signed && x >= static_cast<long long>(std::numeric_limits<T>::min());
    if (!fits) throw py::value_error(std::string(where) + ": " + name + " is out of range, got " + std::to_string(x));
    return static_cast<T>(x);
}

// The config fields (the X-macro lists of config_schema.h) as keyword arguments: the Python type
// of a field of C++ type T is a name for an enum, an int (long long, narrowed) for an integer,
// else T itself.
template <class T>
using PyArg = std::conditional_t<std::is_enum_v<T>, std::string,
                                 std::conditional_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, long long, T>>;

// A keyword argument as its field's value; types only, the values are the native validation's.
template <class T>
T from_py(const char* where, const char* field, const PyArg<T>& x) {
    if constexpr (std::is_enum_v<T>) {
        T e{};
        if (!mnn_h2o::enum_from_name(x, &e))
            throw py::value_error(std::string(where) + ": " + field + " must be one of " + mnn_h2o::enum_names_text<T>() +
                                  ", got '" + x + "'");
        return e;
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        return narrow<T>(where, field, x);
    } else {
        return x;
    }
}

// A field's value for Python: an enum by its name.
template <class T>
auto to_py(const T& x) {
    if constexpr (std::is_enum_v<T>)
        return std::string(mnn_h2o::enum_name(x));
    else
        return x;
}

// The X-macro rows that make a binding of a config struct: a parameter of the lambda, the line
// that stores it in the struct `c`, and the line that writes c's field into the dict `d`.
#define MNN_H2O_PY_PARAM(field, key, CType, CppType) , const PyArg<CppType>& field
#define MNN_H2O_FROM_PY(field, key, CType, CppType) c.field = from_py<CppType>(where, #field, field);
#define MNN_H2O_TO_DICT(field, key, CType, CppType) d[#field] = to_py(c.field);

py::dict config_dict(const EvictionConfig& c) {
    py::dict d;
    MNN_H2O_EVICTION_FIELDS(MNN_H2O_TO_DICT)
    return d;
}

py::dict store_config_dict(const StoreConfig& c) {
    py::dict d;
    MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_TO_DICT)
    return d;
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

// A KvCache method as a binding that calls it inside a NativeCall. The result is converted after
// the call returns, with the GIL held again: eviction_stats() and store_stats() build their dicts
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
    // The keyword defaults of the constructor, enable_eviction and enable_store: the native structs'
    // own, which are the config schema's (config_schema.h).
    const KvCacheConfig kCache;
    const EvictionConfig kEviction;
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
        "attention_kernels",
        [](const py::object& isa) {
            const Isa which = parse_isa(isa);
            const char* name = mnn_h2o::attention_kernels_name(which);
            if (!name)
                throw std::invalid_argument(std::string("ISA '") + mnn_h2o::isa_name(which) +
                                            "' is not available on this CPU/build");
            return std::string(name);
        },
        py::arg("isa") = py::none(),
        "The attention kernel set an ISA runs here: within avx512 the CPU's extensions choose "
        "avx512, avx512-vnni (int8 scores over a q8 prompt) or avx512-bf16 (bf16 P x V too).");
    m.def(
        "kv_dtypes",
        [] {
            std::vector<std::string> names;
            for (int i = 0; i < mnn_h2o::kKvDtypeCount; ++i)
                names.emplace_back(mnn_h2o::kv_dtype_name(static_cast<KvDtype>(i)));
            return names;
        },
        "Names of the KV element types, in the native order (docs/kv_cache.md \"Row formats\").");
    m.attr("KEPT_FIRST") = mnn_h2o::kKeptFirst;  // a kept-first token's score: this + its own
    m.def("policy_names", [] { return mnn_h2o::policy_list(); },
          "Names of the eviction policies, from the native registry (docs/eviction.md \"Policies\").");
    // The keyword defaults of a config struct's fields: the default-constructed struct's.
#define MNN_H2O_PY_ARG_CACHE(field, key, CType, CppType) , py::arg(#field) = to_py(kCache.field)
#define MNN_H2O_PY_ARG_EVICTION(field, key, CType, CppType) , py::arg(#field) = to_py(kEviction.field)
#define MNN_H2O_PY_ARG_STORE(field, key, CType, CppType) , py::arg(#field) = to_py(kStore.field)
    // The native validation of a whole section, for config.validate: one place for the rules over
    // several keys. n_layers 0 leaves out the model's own bounds.
    m.def(
        "eviction_config_error",
        [](int n_layers MNN_H2O_EVICTION_FIELDS(MNN_H2O_PY_PARAM)) {
            const char* where = "eviction_config_error";
            EvictionConfig c;
            MNN_H2O_EVICTION_FIELDS(MNN_H2O_FROM_PY)
            return mnn_h2o::eviction_config_error(c, n_layers);
        },
        py::arg("n_layers") = 0, py::kw_only() MNN_H2O_EVICTION_FIELDS(MNN_H2O_PY_ARG_EVICTION),
        "\"\" if the arguments of enable_eviction are valid (for a model of n_layers layers; 0: any), else what is "
        "wrong, starting with the argument's name.");
    m.def(
        "store_config_error",
        [](int n_layers, int block_tokens MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_PY_PARAM)) {
            const char* where = "store_config_error";
            StoreConfig c;
            MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_FROM_PY)
            KvCacheConfig cache;
            cache.n_layers = n_layers;
            cache.block_tokens = block_tokens;
            return mnn_h2o::store_config_error(c, cache);
        },
        py::arg("n_layers") = 0, py::arg("block_tokens") = kCache.block_tokens,
        py::kw_only() MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_PY_ARG_STORE),
        "\"\" if the arguments of enable_store (but faults) are valid for a cache of block_tokens (and "
        "n_layers layers; 0: any), else what is wrong, starting with the argument's name.");
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
            mnn_h2o::kv_rows_as_stored(dt, rows.data(), out.mutable_data(), static_cast<size_t>(rows.shape(0)), head_dim);
            return out;
        },
        py::arg("dtype"), py::arg("rows"),
        "float32 rows [n, head_dim] as a cache of dtype stores them (docs/kv_cache.md \"Row formats\"; "
        "the r types rotated first), as uint8 [n, kv_row_bytes(dtype, head_dim)].");

    py::class_<PyKvCache>(m, "KvCache", R"doc(
Block-structured KV cache of all layers with its attention op.

k/v rows are float32 [n, n_kv_heads*head_dim] (or [n, n_kv_heads, head_dim]); q rows
[n, n_heads*head_dim] (or 3-D); out is a preallocated float32 [n, n_heads*head_dim] written in
place. scores, if given, is float32 [n_kv_heads, max_blocks] and accumulates (+=) the softmax
mass each key block received, summed over the queries and the query heads of each kv head.
)doc")
        .def(py::init([](int n_layers, int n_kv_heads, int head_dim, int n_heads, int max_tokens,
                         std::vector<int> windows MNN_H2O_RUNTIME_FIELDS(MNN_H2O_PY_PARAM)) {
                 const char* where = "KvCache";
                 KvCacheConfig c;
                 c.n_layers = n_layers;
                 c.n_kv_heads = n_kv_heads;
                 c.head_dim = head_dim;
                 c.n_heads = n_heads;
                 c.max_tokens = max_tokens;
                 c.windows = std::move(windows);
                 MNN_H2O_RUNTIME_FIELDS(MNN_H2O_FROM_PY)
                 return new PyKvCache(c);
             }),
             // The defaults are KvCacheConfig's: the config keys' the config schema's (docs/config.md,
             // runtime.*; runtime.kv_dtype is dtype). windows: per layer, a sliding window in tokens
             // (0: global; empty: every layer global).
             py::arg("n_layers"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("n_heads"), py::kw_only(),
             py::arg("max_tokens") = kCache.max_tokens,
             py::arg("windows") = std::vector<int>() MNN_H2O_RUNTIME_FIELDS(MNN_H2O_PY_ARG_CACHE))
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
            "enable_eviction",
            [](PyKvCache& self MNN_H2O_EVICTION_FIELDS(MNN_H2O_PY_PARAM)) {
                const char* where = "enable_eviction";
                EvictionConfig c;
                MNN_H2O_EVICTION_FIELDS(MNN_H2O_FROM_PY)
                NativeCall call(self);
                self.cache.enable_eviction(c);
            },
            // The defaults are EvictionConfig's, i.e. the config schema's (docs/config.md, h2o.*).
            py::kw_only() MNN_H2O_EVICTION_FIELDS(MNN_H2O_PY_ARG_EVICTION),
            R"doc(Turn eviction on (or replace its settings; scores restart). See docs/eviction.md.
The arguments, their defaults and allowed values are the config keys eviction.* of docs/config.md
(target_keep_ratio or kv_budget_bytes > 0, at most one, replaces target_lossy_ratio;
layer_end -1 = n_layers). ValueError naming the bad argument.)doc")
        .def("disable_eviction", locked(&KvCache::disable_eviction), "Turn eviction off; the tokens held stay.")
        .def_property_readonly("eviction_enabled",
                               [](PyKvCache& self) {
                                   NativeCall call(self);
                                   return self.cache.eviction_config() != nullptr;
                               })
        .def(
            "eviction_config", [](PyKvCache& self) { return active_config(self, &KvCache::eviction_config, config_dict); },
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
            "eviction_stats",
            [](PyKvCache& self) { return stats_dict(locked(&KvCache::eviction_stats)(self)); },
            "Per-layer eviction counters and held tokens/bytes, and whole-model bytes_held, bytes_uncompressed, "
            "lossy_ratio (= uncompressed / held) and policy time.")
        .def(
            "block_scores",
            [](PyKvCache& self, int layer, bool reconstruction) {
                std::vector<float> scores;
                int n_blocks = 0;
                {
                    NativeCall call(self);
                    scores = self.cache.eviction_scores(layer, &n_blocks, reconstruction);
                }
                const py::ssize_t rows = self.cache.config().n_kv_heads;
                return py::array_t<float>({rows, static_cast<py::ssize_t>(n_blocks)}, scores.data());
            },
            py::arg("layer"), py::arg("reconstruction") = false,
            "Current EMA block scores of layer as float32 [n_kv_heads, n_blocks] (NaN: not held or not scored yet); "
            "reconstruction=True: the reconstruction scores (kvzip) instead.")
        .def_property_readonly("eviction_predicts", locked(&KvCache::eviction_predicts),
                               "Whether the eviction policy takes predicted reconstruction scores "
                               "(predicted_kvzip: set_token_scores after each step, no pass).")
        .def(
            "set_token_scores",
            [](PyKvCache& self, int layer, const py::object& scores) {
                const py::ssize_t heads = self.cache.config().n_kv_heads;
                py::array_t<float, py::array::c_style | py::array::forcecast> a(scores);
                if (a.ndim() != 2 || a.shape(0) != heads)
                    throw py::value_error("set_token_scores: scores must be [n_kv_heads=" + std::to_string(heads) +
                                          ", n_tokens], got " + std::to_string(a.ndim()) + " dimensions");
                NativeCall call(self);
                self.cache.set_token_scores(layer, a.data(), static_cast<int>(a.shape(1)));
            },
            py::arg("layer"), py::arg("scores"),
            "Predicted reconstruction scores in [0, 1] of the last n tokens each kv head of an evicting layer holds "
            "(those its last step appended), float32 [n_kv_heads, n]; ValueError unless eviction_predicts.")
        .def("set_prompt_end_share", locked(&KvCache::set_prompt_end_share), py::arg("share"), py::arg("prompt_tokens"),
             "eviction.prompt_end_share for the next prompt step (the prompt's last; 0 after it) of a prompt of "
             "prompt_tokens tokens: its last eviction.observation_window queries' peaks keep that share of the "
             "prompt's own tokens' budget first, each evicting kv head (policies with token scores; their token "
             "scores become KEPT_FIRST + their own until the next prompt's end). ValueError outside [0, 1], or a "
             "share with prompt_tokens < 1.")
        .def_property_readonly("prompt_end_share", locked(&KvCache::prompt_end_share), "The share set_prompt_end_share set.")
        .def("set_query_peaks", locked(&KvCache::set_query_peaks), py::arg("on"),
             "Predicted scores: each prompt chunk's last eviction.observation_window queries also score the "
             "held tokens (their largest probability, max'ed with the prediction); off after enable_eviction. "
             "ValueError unless eviction_predicts (to turn it on).")
        .def_property_readonly("query_peaks", locked(&KvCache::query_peaks), "Whether set_query_peaks is on.")
        .def(
            "token_scores",
            [](PyKvCache& self, int layer) {
                std::vector<std::vector<float>> rows;
                size_t n = 0;
                {
                    NativeCall call(self);
                    for (int h = 0; h < self.cache.config().n_kv_heads; ++h) {
                        rows.push_back(self.cache.token_scores(layer, h));
                        n = std::max(n, rows.back().size());
                    }
                }
                py::array_t<float> out({static_cast<py::ssize_t>(rows.size()), static_cast<py::ssize_t>(n)});
                auto o = out.mutable_unchecked<2>();
                for (size_t h = 0; h < rows.size(); ++h)
                    for (size_t t = 0; t < n; ++t)
                        o(h, t) = t < rows[h].size() ? rows[h][t] : std::numeric_limits<float>::quiet_NaN();
                return out;
            },
            py::arg("layer"),
            "The pending token scores of layer (a pass's peaks, or set_token_scores'), float32 [n_kv_heads, n] "
            "with n the most tokens a head holds; NaN where none (until the layer's next update consumes them).")
        .def_property_readonly("eviction_reconstructs", locked(&KvCache::eviction_reconstructs),
                               "Whether the eviction policy scores blocks by a context reconstruction pass (kvzip).")
        .def_property_readonly("reconstructing", locked(&KvCache::reconstructing),
                               "Whether a reconstruction pass is under way.")
        .def("begin_reconstruction", locked(&KvCache::begin_reconstruction),
             "Start a context reconstruction pass: the tokens stepped from now on are the pass's; the evicting "
             "layers collect each block's peak probability. ValueError unless eviction_reconstructs.")
        .def("rewind_reconstruction", locked(&KvCache::rewind_reconstruction),
             "Drop every token stepped since begin_reconstruction (their memory is freed); the pass goes on.")
        .def("set_reconstruction_window", locked(&KvCache::set_reconstruction_window), py::arg("from_end"),
             py::arg("length"),
             "KVzip's chunk scoring for the pass's next steps: a softmax over the first sink rows "
             "(KvCache::kReconstructionSinks), the `length` "
             "rows starting `from_end` rows before the end of what each head held at the pass's start, and the "
             "pass's rows; peaks for that chunk only. from_end 0: every held row (the default).")
        .def("end_reconstruction", locked(&KvCache::end_reconstruction),
             "Rewind, fold the pass's peaks into the blocks' reconstruction scores (max), end the pass.")
        .def(
            "enable_store",
            [](PyKvCache& self MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_PY_PARAM), const std::vector<std::string>& faults) {
                const char* where = "enable_store";
                StoreConfig c;
                MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_FROM_PY)
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
            py::kw_only() MNN_H2O_LOSSLESS_FIELDS(MNN_H2O_PY_ARG_STORE), py::arg("faults") = std::vector<std::string>(),
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
            "Replace the contents by a snapshot() of a cache of the same shape, dtype and eviction config "
            "(store off). ValueError naming what does not match or decode; the cache is unchanged then.")
        .def_property_readonly("n_layers", [](const PyKvCache& s) { return s.cache.config().n_layers; })
        .def_property_readonly("n_kv_heads", [](const PyKvCache& s) { return s.cache.config().n_kv_heads; })
        .def_property_readonly("head_dim", [](const PyKvCache& s) { return s.cache.config().head_dim; })
        .def_property_readonly("n_heads", [](const PyKvCache& s) { return s.cache.config().n_heads; })
        .def_property_readonly("group", [](const PyKvCache& s) { return s.cache.group(); })
        .def_property_readonly("dtype", [](const PyKvCache& s) { return std::string(mnn_h2o::kv_dtype_name(s.cache.config().dtype)); })
        .def_property_readonly("block_tokens", [](const PyKvCache& s) { return s.cache.config().block_tokens; })
        .def_property_readonly("max_tokens", [](const PyKvCache& s) { return s.cache.config().max_tokens; })
        .def_property_readonly("windows", [](const PyKvCache& s) { return s.cache.config().windows; },
                               "Per layer, its sliding window in tokens (0: global); empty: none.")
        .def_property_readonly("max_blocks", [](const PyKvCache& s) { return s.cache.max_blocks(); })
        .def_property_readonly("threads", [](const PyKvCache& s) { return s.cache.config().threads; });
}
