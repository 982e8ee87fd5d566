// Python face of mnn_h2o::WeightMatrix, the weight types' table and mnn_h2o::DecodeLayers (the decode layers' dense math):
// numpy arrays in, matched by name; shapes checked here; the GIL released while the math runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "float_args.h"
#include "isa_arg.h"
#include "source_args.h"
#include "mnn_h2o/dense/batched_product.h"
#include "mnn_h2o/dense/decode_layers.h"
#include "mnn_h2o/dense/weight_matrix.h"
#include "mnn_h2o/dense/weight_types.h"

namespace py = pybind11;
using mnn_h2o::DecodeLayers;
using mnn_h2o::DecodeLayerWeights;
using mnn_h2o::DecodeShape;
using mnn_h2o::Isa;
using mnn_h2o::WeightMatrix;

namespace {

using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;

template <class T>
std::vector<T> vector_of(const py::array& a, const std::string& name) {
    const auto arr = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!arr) throw py::value_error(name + ": cannot be read as the expected element type");
    return std::vector<T>(arr.data(), arr.data() + arr.size());
}

// A matrix from its parts: a list of (GGUF type name, blocks) stacked by rows, the blocks a uint8
// array [rows, row bytes] or an object with ``rows``, ``row_bytes`` and ``read_into(buffer)``
// (source_args.h: a file's bytes read straight into the matrix).
WeightMatrix weight_matrix(int cols, const py::list& parts, const std::string& name) {
    using Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
    std::vector<WeightMatrix::Part> ps;
    std::vector<Bytes> held;  // the parts' buffers, alive while the matrix copies them
    for (size_t j = 0; j < parts.size(); ++j) {
        const std::string where = name + " part " + std::to_string(j);
        const py::tuple t = parts[j].cast<py::tuple>();
        if (t.size() != 2) throw py::value_error(where + ": expected (type name, blocks)");
        const std::string type = t[0].cast<std::string>();
        const mnn_h2o::WeightTypeTraits* traits = mnn_h2o::find_weight_traits(type);
        if (traits == nullptr) throw py::value_error(where + ": weight type '" + type + "' is not one the core reads");
        if (is_source(t[1])) {
            const py::object source = t[1];
            const SourceShape shape = source_shape(source, where);
            const py::ssize_t n = shape.bytes();
            ps.emplace_back(traits->type, static_cast<int>(shape.rows), static_cast<size_t>(n), [source, n](uint8_t* dst) {
                py::gil_scoped_acquire gil;
                read_source(source, dst, n);
            });
            continue;
        }
        const py::array blocks(t[1]);
        if (blocks.ndim() != 2 || !blocks.dtype().is(py::dtype::of<uint8_t>()))
            throw py::value_error(where + ": blocks must be uint8 [rows, row bytes]");
        if (blocks.shape(0) > INT32_MAX) throw py::value_error(where + ": too many rows");
        held.push_back(Bytes::ensure(blocks));
        if (!held.back()) throw py::value_error(where + ": blocks cannot be read as bytes");
        ps.emplace_back(traits->type, static_cast<int>(blocks.shape(0)), held.back().data(),
                        static_cast<size_t>(held.back().size()));
    }
    try {
        return WeightMatrix(cols, ps);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(name + ": " + e.what());
    }
}

WeightMatrix matrix_from(const py::dict& layer, const std::string& name, int cols, const std::string& where) {
    if (!layer.contains(name)) throw py::value_error(where + ": no '" + name + "'");
    return weight_matrix(cols, layer[name.c_str()].cast<py::list>(), where + " " + name);
}

// The rows of a float32 array of n rows of `width` values (its size a multiple of width, n >= 1).
py::ssize_t rows_of(const py::object& a, py::ssize_t width, const char* name) {
    if (!py::isinstance<py::array_t<float>>(a)) throw py::type_error(std::string(name) + " must be a float32 array");
    const auto arr = py::reinterpret_borrow<py::array>(a);
    if (arr.size() == 0 || arr.size() % width != 0)
        throw py::value_error(std::string(name) + " must hold whole rows of " + std::to_string(width) + " values");
    return arr.size() / width;
}

std::unique_ptr<DecodeLayers> make_layers(const py::dict& shape, const py::sequence& layers, int threads,
                                          const py::object& head) {
    DecodeShape s;
    s.hidden = shape["hidden"].cast<int>();
    s.n_heads = shape["n_heads"].cast<int>();
    s.n_kv_heads = shape["n_kv_heads"].cast<int>();
    s.head_dim = shape["head_dim"].cast<int>();
    s.ffn = shape["ffn"].cast<int>();
    s.rms_eps = shape["rms_eps"].cast<float>();
    if (!shape.contains("form")) throw py::value_error("shape: no 'form' (mnn_h2o/architecture.py, LayerForm.options)");
    for (const auto& kv : shape["form"].cast<py::dict>()) s.form[kv.first.cast<std::string>()] = kv.second.cast<std::string>();
    std::vector<DecodeLayerWeights> ws;
    ws.reserve(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
        // Read one layer at a time: a sequence that makes each layer's arrays when asked for it
        // (native_layers.py) never holds more than one layer twice.
        const py::dict l = layers[i].cast<py::dict>();
        const std::string where = "layer " + std::to_string(i);
        auto vec = [&](const char* key) {
            if (!l.contains(key)) throw py::value_error(where + ": no '" + std::string(key) + "'");
            return vector_of<float>(py::array(l[key]), where + " " + key);
        };
        auto optional = [&](const char* key) { return l.contains(key) ? vec(key) : std::vector<float>{}; };
        DecodeLayerWeights w;
        w.attn_norm = vec("attn_norm");
        w.ffn_norm = vec("ffn_norm");
        w.qkv = matrix_from(l, "qkv", s.hidden, where);
        w.qkv_bias = optional("qkv_bias");
        w.wo = matrix_from(l, "wo", s.n_heads * s.head_dim, where);
        w.gate = matrix_from(l, "gate", s.hidden, where);
        w.up = matrix_from(l, "up", s.hidden, where);
        w.down = matrix_from(l, "down", s.ffn, where);
        w.q_norm = optional("q_norm");
        w.k_norm = optional("k_norm");
        w.post_attn_norm = optional("post_attn_norm");
        w.post_ffn_norm = optional("post_ffn_norm");
        ws.push_back(std::move(w));
    }
    if (threads < 1) throw py::value_error("threads must be >= 1");
    try {
        auto out = std::make_unique<DecodeLayers>(s, std::move(ws), threads);
        if (!head.is_none()) {
            const py::dict d = head.cast<py::dict>();
            if (!d.contains("out_norm") || d.contains("matrix") == d.contains("q8_rows"))
                throw py::value_error("head: a dict of out_norm and either matrix or q8_rows expected");
            std::vector<float> norm = vector_of<float>(py::array(d["out_norm"]), "head out_norm");
            if (d.contains("matrix"))
                out->set_head(std::move(norm), weight_matrix(s.hidden, d["matrix"].cast<py::list>(), "head matrix"));
            else
                out->set_head(std::move(norm), d["q8_rows"].cast<std::shared_ptr<mnn_h2o::Q8Matrix>>());
        }
        return out;
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

void bind_decode_layers(py::module_& m) {
    py::class_<WeightMatrix>(m, "WeightMatrix",
                             "GGUF weight blocks (one type per part: Q4_0, Q4_1, Q4_K, Q6_K) times an "
                             "activation rounded twice to int8 per block of 32 "
                             "(native/include/mnn_h2o/dense/weight_matrix.h)")
        .def(py::init(&weight_matrix), py::arg("cols"), py::arg("parts"), py::arg("name") = "WeightMatrix",
             "parts: list of (GGUF type name, uint8 blocks [rows, row bytes]) as the GGUF stores them, stacked by rows")
        .def_property_readonly("rows", &WeightMatrix::rows)
        .def_property_readonly("cols", &WeightMatrix::cols)
        .def_property_readonly("bytes", &WeightMatrix::bytes)
        .def_property_readonly("types", &WeightMatrix::type_names)
        .def(
            "multiply",
            [](const WeightMatrix& self, Floats x, const py::object& isa) {
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
            py::arg("x"), py::arg("isa") = py::none(), "x float32 [cols] -> [rows]")
        .def(
            "multiply_batch",
            [](const WeightMatrix& self, Floats x, const py::object& isa) {
                if (x.ndim() != 2 || x.shape(1) != self.cols())
                    throw py::value_error("x must be [n, " + std::to_string(self.cols()) + "]");
                const Isa which = parse_isa(isa);
                const int n = static_cast<int>(x.shape(0));
                py::array_t<float> y({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(self.rows())});
                {
                    py::gil_scoped_release release;
                    mnn_h2o::Q8Rows xq;
                    xq.resize(n, self.cols());
                    xq.quantize_rows(x.data(), self.cols(), 0, n);
                    mnn_h2o::multiply_batch(self, xq, 0, self.rows(), y.mutable_data(), self.rows(), which);
                }
                return y;
            },
            py::arg("x"), py::arg("isa") = py::none(),
            "x float32 [n, cols] -> [n, rows]: the batched product (each row of x rounded once to int8 per block of "
            "32, the weights' integers: native/include/mnn_h2o/dense/batched_product.h)");
    m.def(
        "decode_layer_options",
        []() {
            py::dict out;
            for (const mnn_h2o::LayerOption& o : mnn_h2o::decode_layer_options()) {
                py::tuple values(o.values.size());
                for (size_t i = 0; i < o.values.size(); ++i) values[i] = o.values[i];
                out[o.name] = values;
            }
            return out;
        },
        "the decoder layer's options the native decode layers implement, each with its values "
        "(native/include/mnn_h2o/dense/decode_layers.h; mnn_h2o/architecture.py names each architecture's)");
    m.def(
        "weight_types",
        []() {
            size_t n = 0;
            const mnn_h2o::WeightTypeTraits* t = mnn_h2o::weight_traits_table(&n);
            py::list out;
            for (size_t i = 0; i < n; ++i) {
                py::dict d;
                d["name"] = t[i].name;
                d["ggml_id"] = static_cast<int>(t[i].type);
                d["block_values"] = t[i].block_values;
                d["block_bytes"] = t[i].block_bytes;
                d["half_offsets"] = py::make_tuple(t[i].half_offsets[0], t[i].half_offsets[1]);
                out.append(d);
            }
            return out;
        },
        "the core's weight block types (native/include/mnn_h2o/dense/weight_types.h): name, ggml_id, "
        "block_values, block_bytes, half_offsets (byte "
        "offsets of a block's fp16 scales, -1: none)");
    m.def(
        "dequantize_blocks",
        [](const std::string& type, const py::array& blocks) {
            const mnn_h2o::WeightTypeTraits* t = mnn_h2o::find_weight_traits(type);
            if (t == nullptr) throw py::value_error("weight type '" + type + "' is not one the core reads");
            const auto b = vector_of<uint8_t>(blocks, "blocks");
            if (b.size() % static_cast<size_t>(t->block_bytes) != 0)
                throw py::value_error(std::to_string(b.size()) + " bytes are not whole " + t->name + " blocks");
            const size_t n = b.size() / static_cast<size_t>(t->block_bytes);
            py::array_t<float> out(static_cast<py::ssize_t>(n * static_cast<size_t>(t->block_values)));
            t->dequantize(b.data(), out.mutable_data(), n);
            return out;
        },
        py::arg("type"), py::arg("blocks"), "the core's reference decoding of whole blocks -> float32 values");

    auto cls = py::class_<DecodeLayers>(m, "DecodeLayers",
                             "the decoder layers' dense math for one decode token "
                             "(native/include/mnn_h2o/dense/decode_layers.h)")
        .def(py::init(&make_layers), py::arg("shape"), py::arg("layers"), py::arg("threads") = 1,
             py::arg("head") = py::none(),
             "shape: dict of hidden, n_heads, n_kv_heads, head_dim, ffn, rms_eps, form (the layer's options by name); layers: one dict per "
             "layer of attn_norm, ffn_norm, optional qkv_bias, q_norm / k_norm (qk_norm), post_attn_norm / post_ffn_norm "
             "(post_norms), and qkv, wo, gate, up, down: each a list of "
             "(GGUF type name, uint8 blocks [rows, row bytes]) stacked by rows (WeightMatrix); head: None or a dict "
             "of out_norm (the final norm) and either matrix (the output projection's parts, as a matrix above) or "
             "q8_rows (a Q8Matrix, shared: its rows times the float activation)")
        .def_property_readonly("n_layers", &DecodeLayers::n_layers)
        .def_property_readonly("has_head", &DecodeLayers::has_head)
        .def_property_readonly("vocab", &DecodeLayers::vocab)
        .def_property_readonly("reads_kquant", &DecodeLayers::reads_kquant)
        .def(
            "logits",
            [](DecodeLayers& self, const py::object& h, const py::object& attn, const py::object& out,
               const py::object& isa) {
                const DecodeShape& s = self.shape();
                float* hp = const_cast<float*>(floats_of(h, s.hidden, "h", true));
                const float* ap = floats_of(attn, s.n_heads * s.head_dim, "attn", false);
                float* op = const_cast<float*>(floats_of(out, self.vocab(), "out", true));
                const Isa which = parse_isa(isa);
                try {
                    py::gil_scoped_release release;
                    self.logits(hp, ap, op, which);
                } catch (const std::invalid_argument& e) {
                    throw py::value_error(e.what());
                }
            },
            py::arg("h"), py::arg("attn"), py::arg("out"), py::arg("isa") = py::none(),
            "the last layer's end from its attention output attn (into h, in place), the final norm and the "
            "logits into out (vocab float32 values): a token's tail and lm_head in one call")
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
            "worker threads sleep after the call (False: they poll for the next; decode_token runs a whole token "
            "so, its attention on them too)");
    cls.def(
            "forward_rows",
            [](DecodeLayers& self, int i, const py::object& h, const py::object& attn, const py::object& cos,
               const py::object& sin, const py::object& q, const py::object& k, const py::object& v,
               const py::object& isa) {
                const DecodeShape& s = self.shape();
                const py::ssize_t nq = s.n_heads * s.head_dim, nk = s.n_kv_heads * s.head_dim;
                const py::ssize_t n = rows_of(h, s.hidden, "h");
                float* hp = const_cast<float*>(floats_of(h, n * s.hidden, "h", true));
                const float* ap = attn.is_none() ? nullptr : floats_of(attn, n * nq, "attn", false);
                const float* cp = floats_of(cos, n * s.head_dim, "cos", false);
                const float* sp = floats_of(sin, n * s.head_dim, "sin", false);
                float* qp = const_cast<float*>(floats_of(q, n * nq, "q", true));
                float* kp = const_cast<float*>(floats_of(k, n * nk, "k", true));
                float* vp = const_cast<float*>(floats_of(v, n * nk, "v", true));
                const Isa which = parse_isa(isa);
                try {
                    py::gil_scoped_release release;
                    self.forward_rows(i, static_cast<int>(n), hp, ap, cp, sp, qp, kp, vp, which);
                } catch (const std::out_of_range& e) {
                    throw py::index_error(e.what());
                } catch (const std::invalid_argument& e) {
                    throw py::value_error(e.what());
                }
            },
            py::arg("i"), py::arg("h"), py::arg("attn"), py::arg("cos"), py::arg("sin"), py::arg("q"), py::arg("k"),
            py::arg("v"), py::arg("isa") = py::none(),
            "a prompt chunk of n tokens through layer i's module, as forward does per row: h [n, hidden] (in place), "
            "attn [n, n_heads head_dim] or None, cos and sin [n, head_dim], q, k, v [n, heads head_dim]; from 16 rows "
            "the products are batched (the weights' integers, each activation row rounded once to int8 per block of 32)")
        .def(
            "logits_rows",
            [](DecodeLayers& self, const py::object& h, const py::object& attn, const py::object& out,
               const py::object& isa) {
                const DecodeShape& s = self.shape();
                const py::ssize_t n = rows_of(h, s.hidden, "h");
                float* hp = const_cast<float*>(floats_of(h, n * s.hidden, "h", true));
                const float* ap = floats_of(attn, n * s.n_heads * s.head_dim, "attn", false);
                float* op = const_cast<float*>(floats_of(out, n * self.vocab(), "out", true));
                const Isa which = parse_isa(isa);
                try {
                    py::gil_scoped_release release;
                    self.logits_rows(static_cast<int>(n), hp, ap, op, which);
                } catch (const std::invalid_argument& e) {
                    throw py::value_error(e.what());
                }
            },
            py::arg("h"), py::arg("attn"), py::arg("out"), py::arg("isa") = py::none(),
            "logits for n rows: h [n, hidden] (in place), attn [n, n_heads head_dim], out [n, vocab]; batched as "
            "forward_rows");
}
