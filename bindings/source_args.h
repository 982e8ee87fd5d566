// A source argument of the bindings: an array's bytes in a file (mnn_h2o/stored_arrays.py's
// StoredBlocks: ``rows``, ``row_bytes``, ``read_into(buffer)``) that native memory is filled from
// directly, so a file's rows are never held twice (a matrix of the decode layers, a head's q8 rows).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

struct SourceShape {
    pybind11::ssize_t rows, row_bytes;
    pybind11::ssize_t bytes() const { return rows * row_bytes; }
};

// Whether an argument is a source rather than an array.
inline bool is_source(const pybind11::handle& a) { return !pybind11::isinstance<pybind11::array>(a); }

// A source's shape, checked: rows in [1, INT32_MAX], row_bytes >= 1, their product representable.
inline SourceShape source_shape(const pybind11::object& source, const std::string& name) {
    namespace py = pybind11;
    const py::ssize_t rows = source.attr("rows").cast<py::ssize_t>();
    const py::ssize_t row_bytes = source.attr("row_bytes").cast<py::ssize_t>();
    if (rows <= 0 || rows > INT32_MAX || row_bytes <= 0 || row_bytes > PY_SSIZE_T_MAX / rows)
        throw py::value_error(name + ": a source of " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                              " bytes");
    return {rows, row_bytes};
}

// The source's bytes into dst (n bytes: its rows * row_bytes); needs the GIL.
inline void read_source(const pybind11::object& source, void* dst, pybind11::ssize_t n) {
    source.attr("read_into")(pybind11::memoryview::from_memory(dst, n));
}
