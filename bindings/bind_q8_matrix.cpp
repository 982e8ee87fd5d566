// Python face of mnn_h2o::Q8Matrix (the native lm_head): numpy codes / scales in, float32 logits
// out, shapes checked here, the GIL released while the kernel runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mnn_h2o/head/q8_matrix.h"
#include "isa_arg.h"

namespace py = pybind11;
using mnn_h2o::Isa;
using mnn_h2o::Q8Matrix;

namespace {

std::string shape_of(const py::array& a) { return py::str(a.attr("shape")); }

Q8Matrix make(py::array_t<int8_t, py::array::c_style | py::array::forcecast> codes,
              py::array_t<uint16_t, py::array::c_style> scales, int threads) {
    if (codes.ndim() != 2) throw py::value_error("codes must be [rows, cols] int8, got shape " + shape_of(codes));
    if (scales.ndim() != 2 || scales.shape(0) != codes.shape(0) || scales.shape(1) * 32 != codes.shape(1))
        throw py::value_error("scales must be [rows, cols / 32] fp16 bits for codes of shape " + shape_of(codes) +
                              ", got " + shape_of(scales));
    if (codes.shape(0) > INT32_MAX || codes.shape(1) > INT32_MAX) throw py::value_error("codes: too large");
    std::vector<int8_t> c(codes.data(), codes.data() + codes.size());
    std::vector<uint16_t> s(scales.data(), scales.data() + scales.size());
    try {
        return Q8Matrix(static_cast<int>(codes.shape(0)), static_cast<int>(codes.shape(1)), std::move(c),
                        std::move(s), threads);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

void bind_q8_matrix(py::module_& m) {
    // Shared: the decode layers may hold it as their output matrix (DecodeLayers' head q8_rows)
    // while the engine reads a tied embedding's rows from it.
    py::class_<Q8Matrix, std::shared_ptr<Q8Matrix>>(m, "Q8Matrix",
                         "q8_0 rows (int8 codes, one fp16 scale per 32) times float activations: the "
                         "native lm_head (native/include/mnn_h2o/head/q8_matrix.h)")
        .def(py::init(&make), py::arg("codes"), py::arg("scales"), py::arg("threads") = 1,
             "codes int8 [rows, cols]; scales [rows, cols / 32] as fp16 bits (numpy float16 viewed as uint16)")
        .def_property_readonly("rows", &Q8Matrix::rows)
        .def_property_readonly("cols", &Q8Matrix::cols)
        .def_property_readonly("bytes", &Q8Matrix::bytes)
        .def(
            "multiply",
            [](const Q8Matrix& self, py::array_t<float, py::array::c_style | py::array::forcecast> x,
               const py::object& isa) {
                if (x.ndim() != 2 || x.shape(1) != self.cols())
                    throw py::value_error("x must be [n, " + std::to_string(self.cols()) + "], got " + shape_of(x));
                if (x.shape(0) > INT32_MAX) throw py::value_error("x: too many rows");
                const int n = static_cast<int>(x.shape(0));
                const Isa which = parse_isa(isa);
                py::array_t<float> y({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(self.rows())});
                {
                    py::gil_scoped_release release;
                    self.multiply(x.data(), n, y.mutable_data(), which);
                }
                return y;
            },
            py::arg("x"), py::arg("isa") = py::none(),
            "x float32 [n, cols] -> [n, rows]; isa 'scalar' | 'avx2' | 'avx512' (default: the widest available)")
        .def(
            "rows_of",
            [](const Q8Matrix& self, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
                if (ids.ndim() != 1) throw py::value_error("ids must be 1-D, got " + shape_of(ids));
                if (ids.shape(0) > INT32_MAX) throw py::value_error("ids: too many");
                const int n = static_cast<int>(ids.shape(0));
                py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(self.cols())});
                try {
                    self.rows_of(ids.data(), n, out.mutable_data());
                } catch (const std::out_of_range& e) {
                    throw py::index_error(e.what());
                }
                return out;
            },
            py::arg("ids"),
            "Rows ids (int [n]) as float32 [n, cols], each value code * scale exactly: a tied embedding's rows.");
}
