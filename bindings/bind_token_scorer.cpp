// Python face of mnn_h2o::TokenScorer (eviction/token_scorer.h): predicted_kvzip's map in the core,
// callable as observe(layer, h) like mnn_h2o/token_scorer.py's scores, and taken by decode_token
// without a call back into Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "mnn_h2o/eviction/token_scorer.h"

namespace py = pybind11;
using mnn_h2o::TokenScorer;

void bind_token_scorer(py::module_& m) {
    py::class_<TokenScorer>(m, "TokenScorer", "eviction.policy predicted_kvzip's linear map per layer, in the core")
        .def(py::init([](const py::array_t<float, py::array::c_style | py::array::forcecast>& weights, int layer_start,
                         int layer_end) {
                 if (weights.ndim() != 3)
                     throw py::value_error("TokenScorer: weights must be [n_layers, hidden + 1, n_kv_heads]");
                 std::vector<float> w(weights.data(), weights.data() + weights.size());
                 try {
                     return new TokenScorer(w, static_cast<int>(weights.shape(0)),
                                            static_cast<int>(weights.shape(1)) - 1, static_cast<int>(weights.shape(2)),
                                            layer_start, layer_end);
                 } catch (const std::invalid_argument& e) {
                     throw py::value_error(e.what());
                 }
             }),
             py::arg("weights"), py::arg("layer_start"), py::arg("layer_end"),
             "weights float32 [n_layers, hidden + 1, n_kv_heads] (token_scorer.py's); layers [layer_start, "
             "layer_end) score")
        .def(
            "__call__",
            [](const TokenScorer& self, int layer, const py::array_t<float, py::array::c_style | py::array::forcecast>& h)
                -> py::object {
                const py::ssize_t hidden = self.hidden();
                if (h.ndim() < 1 || h.ndim() > 2 || h.shape(h.ndim() - 1) != hidden || h.size() == 0)
                    throw py::value_error("TokenScorer: h must be [n, " + std::to_string(hidden) + "] float32 rows");
                const py::ssize_t n = h.size() / hidden;
                py::array_t<float> out({static_cast<py::ssize_t>(self.n_kv_heads()), n});
                if (!self.scores(layer, h.data(), static_cast<int>(n), out.mutable_data())) return py::none();
                return std::move(out);
            },
            py::arg("layer"), py::arg("h"),
            "the predicted scores of h's rows [n, hidden] at layer: float32 [n_kv_heads, n] in (0, 1], or None "
            "for a layer outside the map's range");
}
