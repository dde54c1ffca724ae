// The parts of the torch_accel._C module.
#pragma once

#include <pybind11/pybind11.h>

namespace accel::python {

// torch.accel support: lazy init, fork state, generators, fallback statistics.
void init_torch_bindings(pybind11::module_& m);

}  // namespace accel::python
