// A float32 array argument of the bindings: checked for its type, size, layout and, where the
// native code writes it, writability, before a pointer to its values goes to native code.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

inline const float* floats_of(const pybind11::object& a, pybind11::ssize_t n, const char* name, bool writable) {
    namespace py = pybind11;
    if (!py::isinstance<py::array_t<float>>(a)) throw py::type_error(std::string(name) + " must be a float32 array");
    auto arr = py::reinterpret_borrow<py::array_t<float>>(a);
    if (!(arr.flags() & py::array::c_style) || arr.size() != n)
        throw py::value_error(std::string(name) + " must be a C-contiguous float32 array of " + std::to_string(n) +
                              " values, got " + std::to_string(arr.size()));
    if (writable && !arr.writeable()) throw py::value_error(std::string(name) + " must be writable");
    return arr.data();
}
