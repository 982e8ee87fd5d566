// Python face of mnn_h2o::Q4Matrix and mnn_h2o::DecodeLayers (the decode layers' dense math):
// numpy arrays in, matched by name; shapes checked here; the GIL released while the math runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "isa_arg.h"
#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/dense/decode_layers.h"
#include "mnn_h2o/dense/q4_matrix.h"

namespace py = pybind11;
using mnn_h2o::DecodeLayers;
using mnn_h2o::DecodeLayerWeights;
using mnn_h2o::DecodeShape;
using mnn_h2o::Isa;
using mnn_h2o::Q4Matrix;

namespace {

using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;

template <class T>
std::vector<T> vector_of(const py::array& a, const std::string& name) {
    const auto arr = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!arr) throw py::value_error(name + ": cannot be read as the expected element type");
    return std::vector<T>(arr.data(), arr.data() + arr.size());
}

Q4Matrix q4_matrix(const py::array& nibbles, const py::array& scales, const py::array& mins, const std::string& name) {
    if (nibbles.ndim() != 2 || scales.ndim() != 2 || mins.ndim() != 2)
        throw py::value_error(name + ": nibbles [rows, cols / 2], scales and mins [rows, cols / 32] expected");
    for (const py::array* a : {&scales, &mins})
        if (!a->dtype().is(py::dtype::of<uint16_t>()))  // a float array would be cast by value
            throw py::value_error(name + ": scales and mins must be fp16 bits (numpy float16 viewed as uint16)");
    const py::ssize_t rows = nibbles.shape(0), cols = nibbles.shape(1) * 2;
    if (rows > INT32_MAX || cols > INT32_MAX) throw py::value_error(name + ": too large");
    try {
        return Q4Matrix(static_cast<int>(rows), static_cast<int>(cols), vector_of<uint8_t>(nibbles, name + ".nibbles"),
                        vector_of<uint16_t>(scales, name + ".scales"), vector_of<uint16_t>(mins, name + ".mins"));
    } catch (const std::invalid_argument& e) {
        throw py::value_error(name + ": " + e.what());
    }
}

Q4Matrix matrix_from(const py::dict& layer, const std::string& name, const std::string& where) {
    auto get = [&](const std::string& key) -> py::array {
        const std::string full = name + "." + key;
        if (!layer.contains(full)) throw py::value_error(where + ": no '" + full + "'");
        return py::array(layer[full.c_str()]);
    };
    return q4_matrix(get("nibbles"), get("scales"), get("mins"), where + " " + name);
}

const float* floats_of(const py::object& a, py::ssize_t n, const char* name, bool writable) {
    if (!py::isinstance<py::array_t<float>>(a)) throw py::type_error(std::string(name) + " must be a float32 array");
    auto arr = py::reinterpret_borrow<py::array_t<float>>(a);
    if (!(arr.flags() & py::array::c_style) || arr.size() != n)
        throw py::value_error(std::string(name) + " must be a C-contiguous float32 array of " + std::to_string(n) +
                              " values, got " + std::to_string(arr.size()));
    if (writable && !arr.writeable()) throw py::value_error(std::string(name) + " must be writable");
    return arr.data();
}

std::unique_ptr<DecodeLayers> make_layers(const py::dict& shape, const py::list& layers, int threads) {
    DecodeShape s;
    s.hidden = shape["hidden"].cast<int>();
    s.n_heads = shape["n_heads"].cast<int>();
    s.n_kv_heads = shape["n_kv_heads"].cast<int>();
    s.head_dim = shape["head_dim"].cast<int>();
    s.ffn = shape["ffn"].cast<int>();
    s.rms_eps = shape["rms_eps"].cast<float>();
    std::vector<DecodeLayerWeights> ws;
    ws.reserve(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
        const py::dict l = layers[i].cast<py::dict>();
        const std::string where = "layer " + std::to_string(i);
        auto vec = [&](const char* key) {
            if (!l.contains(key)) throw py::value_error(where + ": no '" + std::string(key) + "'");
            return vector_of<float>(py::array(l[key]), where + " " + key);
        };
        ws.push_back(DecodeLayerWeights{vec("attn_norm"), vec("ffn_norm"), matrix_from(l, "qkv", where),
                                        l.contains("qkv_bias") ? vec("qkv_bias") : std::vector<float>{},
                                        matrix_from(l, "wo", where), matrix_from(l, "gate", where),
                                        matrix_from(l, "up", where), matrix_from(l, "down", where)});
    }
    if (threads < 1) throw py::value_error("threads must be >= 1");
    try {
        return std::make_unique<DecodeLayers>(s, std::move(ws), threads);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

void bind_decode_layers(py::module_& m) {
    py::class_<Q4Matrix>(m, "Q4Matrix",
                         "GGUF 4-bit blocks of 32 times an activation rounded to int8 per block "
                         "(native/include/mnn_h2o/dense/q4_matrix.h)")
        .def(py::init(&q4_matrix), py::arg("nibbles"), py::arg("scales"), py::arg("mins"), py::arg("name") = "Q4Matrix",
             "nibbles uint8 [rows, cols / 2], scales and mins [rows, cols / 32] as fp16 bits (numpy float16 "
             "viewed as uint16): the GGUF's blocks")
        .def_property_readonly("rows", &Q4Matrix::rows)
        .def_property_readonly("cols", &Q4Matrix::cols)
        .def_property_readonly("bytes", &Q4Matrix::bytes)
        .def(
            "multiply",
            [](const Q4Matrix& self, Floats x, const py::object& isa) {
                if (x.ndim() != 1 || x.shape(0) != self.cols())
                    throw py::value_error("x must be [" + std::to_string(self.cols()) + "]");
                const Isa which = parse_isa(isa);
                py::array_t<float> y(self.rows());
                {
                    py::gil_scoped_release release;
                    mnn_h2o::Q8Activation xq;
                    xq.quantize(x.data(), self.cols());
                    self.multiply_rows(xq, 0, self.rows(), y.mutable_data(), which);
                }
                return y;
            },
            py::arg("x"), py::arg("isa") = py::none(), "x float32 [cols] -> [rows]");

    py::class_<DecodeLayers>(m, "DecodeLayers",
                             "the decoder layers' dense math for one decode token "
                             "(native/include/mnn_h2o/dense/decode_layers.h)")
        .def(py::init(&make_layers), py::arg("shape"), py::arg("layers"), py::arg("threads") = 1,
             "shape: dict of hidden, n_heads, n_kv_heads, head_dim, ffn, rms_eps; layers: one dict per "
             "layer of attn_norm, ffn_norm, optional qkv_bias, and {qkv,wo,gate,up,down}.{nibbles,scales,mins}")
        .def_property_readonly("n_layers", &DecodeLayers::n_layers)
        .def_property_readonly("bytes", &DecodeLayers::bytes)
        .def(
            "forward",
            [](DecodeLayers& self, int i, const py::object& h, const py::object& attn, const py::object& cos,
               const py::object& sin, const py::object& q, const py::object& k, const py::object& v,
               const py::object& isa, bool rest) {
                const DecodeShape& s = self.shape();
                const py::ssize_t nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim;
                float* hp = const_cast<float*>(floats_of(h, s.hidden, "h", true));
                const float* ap = attn.is_none() ? nullptr : floats_of(attn, nq, "attn", false);
                const float* cp = floats_of(cos, s.head_dim, "cos", false);
                const float* sp = floats_of(sin, s.head_dim, "sin", false);
                float* qp = const_cast<float*>(floats_of(q, nq, "q", true));
                float* kp = const_cast<float*>(floats_of(k, nk, "k", true));
                float* vp = const_cast<float*>(floats_of(v, nk, "v", true));
                const Isa which = parse_isa(isa);
                try {
                    py::gil_scoped_release release;
                    self.forward(i, hp, ap, cp, sp, qp, kp, vp, which, rest);
                } catch (const std::out_of_range& e) {
                    throw py::index_error(e.what());
                } catch (const std::invalid_argument& e) {
                    throw py::value_error(e.what());
                }
            },
            py::arg("i"), py::arg("h"), py::arg("attn"), py::arg("cos"), py::arg("sin"), py::arg("q"), py::arg("k"),
            py::arg("v"), py::arg("isa") = py::none(), py::arg("rest") = true,
            "one token through layer i's module: finishes layer i - 1 from attn into h (in place) unless attn is "
            "None, then writes layer i's rotated q, k and v; every array float32 and C-contiguous. rest: the "
            "worker threads sleep after the call (False: they poll for the next, through an attention that "
            "runs on the calling thread)");
    // Decode attention uses its threads from this many keys (one query row): the engine lets the
    // decode layers' workers poll through the attention below it and rest from it.
    m.attr("ATTENTION_PARALLEL_MIN_KEYS") = mnn_h2o::kParallelMinQueryKeys;
}
