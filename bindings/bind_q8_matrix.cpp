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
#include "source_args.h"

namespace py = pybind11;
using mnn_h2o::Isa;
using mnn_h2o::Q8Matrix;

namespace {

std::string shape_of(const py::array& a) { return py::str(a.attr("shape")); }

Q8Matrix make_from(std::vector<int8_t> c, std::vector<uint16_t> s, int rows, int cols, int threads) {
    try {
        return Q8Matrix(rows, cols, std::move(c), std::move(s), threads);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

// A vector of a source's bytes (source_args.h), read straight into it; the source must be
// rows x row_bytes.
template <class T>
std::vector<T> read_vector(const py::object& source, const char* name, py::ssize_t rows, py::ssize_t row_bytes) {
    const SourceShape shape = source_shape(source, name);
    if (shape.rows != rows || shape.row_bytes != row_bytes) throw py::value_error(std::string(name) + ": a source of another shape");
    std::vector<T> out(static_cast<size_t>(shape.bytes()) / sizeof(T));
    read_source(source, out.data(), shape.bytes());
    return out;
}

Q8Matrix make(const py::object& codes_in, const py::object& scales_in, int threads) {
    if (is_source(codes_in)) {
        const SourceShape codes = source_shape(codes_in, "codes");
        const py::ssize_t rows = codes.rows, cols = codes.row_bytes;
        if (cols > INT32_MAX || cols % 32 != 0)
            throw py::value_error("codes: rows of " + std::to_string(cols) + " values, not a multiple of 32");
        std::vector<int8_t> c = read_vector<int8_t>(codes_in, "codes", rows, cols);
        std::vector<uint16_t> s = read_vector<uint16_t>(scales_in, "scales", rows, cols / 32 * 2);
        return make_from(std::move(c), std::move(s), static_cast<int>(rows), static_cast<int>(cols), threads);
    }
    const auto codes = py::array_t<int8_t, py::array::c_style | py::array::forcecast>::ensure(codes_in);
    const auto scales = py::array_t<uint16_t, py::array::c_style>::ensure(scales_in);
    if (!codes || !scales) throw py::value_error("codes and scales: int8 and fp16-bit arrays, or sources");
    if (codes.ndim() != 2) throw py::value_error("codes must be [rows, cols] int8, got shape " + shape_of(codes));
    if (scales.ndim() != 2 || scales.shape(0) != codes.shape(0) || scales.shape(1) * 32 != codes.shape(1))
        throw py::value_error("scales must be [rows, cols / 32] fp16 bits for codes of shape " + shape_of(codes) +
                              ", got " + shape_of(scales));
    if (codes.shape(0) > INT32_MAX || codes.shape(1) > INT32_MAX) throw py::value_error("codes: too large");
    std::vector<int8_t> c(codes.data(), codes.data() + codes.size());
    std::vector<uint16_t> s(scales.data(), scales.data() + scales.size());
    return make_from(std::move(c), std::move(s), static_cast<int>(codes.shape(0)), static_cast<int>(codes.shape(1)),
                     threads);
}

}  // namespace

void bind_q8_matrix(py::module_& m) {
    // Shared: the decode layers may hold it as their output matrix (DecodeLayers' head q8_rows)
    // while the engine reads a tied embedding's rows from it.
    py::class_<Q8Matrix, std::shared_ptr<Q8Matrix>>(m, "Q8Matrix",
                         "q8_0 rows (int8 codes, one fp16 scale per 32) times float activations: the "
                         "native lm_head (native/include/mnn_h2o/head/q8_matrix.h)")
        .def(py::init(&make), py::arg("codes"), py::arg("scales"), py::arg("threads") = 1,
             "codes int8 [rows, cols]; scales [rows, cols / 32] as fp16 bits (numpy float16 viewed as uint16); or "
             "each a source (mnn_h2o.stored_arrays.StoredBlocks) read straight into the matrix")
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
