// An `isa=` keyword argument of the bindings: None = the widest ISA available, else its name.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "mnn_h2o/runtime/cpu_features.h"

inline mnn_h2o::Isa parse_isa(const pybind11::object& name) {
    using mnn_h2o::Isa;
    if (name.is_none()) return mnn_h2o::best_isa();
    const std::string s = pybind11::str(name);
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon})
        if (s == mnn_h2o::isa_name(isa)) return isa;
    throw pybind11::value_error("isa must be 'scalar', 'avx2', 'avx512' or 'neon', got '" + s + "'");
}
