// Python face of mnn_h2o::decode_token: one decode token through the decode layers and a cache in
// one call (model/decode_token.h); arrays checked here, the GIL released while it runs and taken
// again only for a Python observer (a TokenScorer runs in the core).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "float_args.h"
#include "isa_arg.h"
#include "mnn_h2o/dense/decode_layers.h"
#include "mnn_h2o/eviction/token_scorer.h"
#include "mnn_h2o/model/decode_token.h"
#include "py_kv_cache.h"

namespace py = pybind11;
using mnn_h2o::DecodeLayers;

void bind_decode_token(py::module_& m) {
    m.def(
        "decode_token",
        [](DecodeLayers& layers, PyKvCache& cache, const py::object& h, const py::object& cos, const py::object& sin,
           const py::object& q, const py::object& k, const py::object& v, const py::object& attn,
           const py::object& observe, const py::object& isa, const py::object& local_cos,
           const py::object& local_sin, const py::object& logits) {
            const mnn_h2o::DecodeShape& s = layers.shape();
            const py::ssize_t nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim;
            float* hp = const_cast<float*>(floats_of(h, s.hidden, "h", true));
            const float* cp = floats_of(cos, s.head_dim, "cos", false);
            const float* sp = floats_of(sin, s.head_dim, "sin", false);
            const float* lcp = local_cos.is_none() ? nullptr : floats_of(local_cos, s.head_dim, "local_cos", false);
            const float* lsp = local_sin.is_none() ? nullptr : floats_of(local_sin, s.head_dim, "local_sin", false);
            float* qp = const_cast<float*>(floats_of(q, nq, "q", true));
            float* kp = const_cast<float*>(floats_of(k, nk, "k", true));
            float* vp = const_cast<float*>(floats_of(v, nk, "v", true));
            float* ap = const_cast<float*>(floats_of(attn, nq, "attn", true));
            if (!logits.is_none() && !layers.has_head())
                throw py::value_error("decode_token: logits asked of layers that hold no output matrix");
            float* lp = logits.is_none() ? nullptr : const_cast<float*>(floats_of(logits, layers.vocab(), "logits", true));
            const mnn_h2o::Isa which = parse_isa(isa);
            mnn_h2o::LayerObserver see;
            if (py::isinstance<mnn_h2o::TokenScorer>(observe)) {
                // The core's map: every layer scored without the GIL.
                const mnn_h2o::TokenScorer& scorer = observe.cast<const mnn_h2o::TokenScorer&>();
                if (scorer.hidden() != s.hidden || scorer.n_kv_heads() != s.n_kv_heads ||
                    scorer.n_layers() != layers.n_layers())
                    throw py::value_error("decode_token: the TokenScorer's shape is not the layers'");
                see = [&scorer](int layer, const float* hp, std::vector<float>& scores) {
                    scores.resize(static_cast<size_t>(scorer.n_kv_heads()));
                    return scorer.scores(layer, hp, 1, scores.data());
                };
            } else if (!observe.is_none()) {
                const py::ssize_t heads = s.n_kv_heads;
                // h stays the caller's array, so the observer is handed that array itself.
                see = [&observe, &h, heads](int layer, const float*, std::vector<float>& scores) {
                    py::gil_scoped_acquire gil;
                    const py::object out = observe(layer, h);
                    if (out.is_none()) return false;
                    const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(out);
                    if (!a || a.size() != heads)
                        throw py::value_error("decode_token: the observer must return None or " +
                                              std::to_string(heads) + " scores (one per kv head)");
                    scores.assign(a.data(), a.data() + heads);
                    return true;
                };
            }
            mnn_h2o::TokenTimes t;
            try {
                NativeCall call(cache);
                t = mnn_h2o::decode_token(layers, cache.cache, hp, cp, sp, qp, kp, vp, ap, which, see, lcp, lsp, lp);
            } catch (const std::out_of_range& e) {
                throw py::index_error(e.what());
            } catch (const std::invalid_argument& e) {
                throw py::value_error(e.what());
            }
            return py::make_tuple(t.dense_s, t.attention_s, t.observe_s, t.head_s);
        },
        py::arg("layers"), py::arg("cache"), py::arg("h"), py::arg("cos"), py::arg("sin"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("attn"), py::arg("observe") = py::none(), py::arg("isa") = py::none(),
        py::arg("local_cos") = py::none(), py::arg("local_sin") = py::none(), py::arg("logits") = py::none(),
        "One decode token through every layer and its cache step, on the layers' threads: h [hidden] (the "
        "embedding in, the last layer's input hidden state out), cos / sin [head_dim] (local_cos / local_sin: the "
        "sliding-window layers', where the cache has windows), q, k, v scratch, attn "
        "[n_heads * head_dim] (the last layer's attention output out); every array float32 and C-contiguous. "
        "observe(layer, h) after each layer's step returns None or that layer's predicted reconstruction "
        "scores of the token (n_kv_heads floats, set_token_scores) and must not call the cache; a TokenScorer "
        "is applied in the core, without the GIL. logits: None, or [vocab] float32 that the layers' head fills "
        "in the same call (layers with has_head). Returns the "
        "seconds of (the layers' products, the cache steps, the observer, the head: 0 without logits).");
}
