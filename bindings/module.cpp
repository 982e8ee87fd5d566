// mnn_h2o._core: the Python face of the native core. Each bind_*.cpp converts the types of one
// part of the C++ API; no logic lives here.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_kv_cache(py::module_& m);
void bind_codec(py::module_& m);
void bind_q8_matrix(py::module_& m);
void bind_decode_layers(py::module_& m);
void bind_decode_token(py::module_& m);
void bind_token_scorer(py::module_& m);

PYBIND11_MODULE(_core, m) {
    m.doc() = "mnn_h2o native core: KV cache, attention, H2O policy, Gear codec, q8 lm_head, decode layers";
    bind_kv_cache(m);
    bind_codec(m);
    bind_q8_matrix(m);
    bind_decode_layers(m);
    bind_decode_token(m);
    bind_token_scorer(m);
}
