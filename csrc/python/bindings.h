// The parts of the torch_accel._C module.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>

#include "runtime/types.h"

namespace accel::python {

// Memory pool ids are (int, int) tuples in Python, as torch.cuda's.
using PoolTuple = std::pair<uint64_t, uint64_t>;
inline rt::PoolId pool_of(const PoolTuple& p) {
  return rt::PoolId{p.first, p.second};
}
inline PoolTuple pool_tuple(rt::PoolId p) {
  return {p.first, p.second};
}

// torch.accel support: lazy init, fork state, generators, fallback statistics; capture errors
// raised inside operators surface as `capture_error` (torch_accel.CaptureError).
void init_torch_bindings(pybind11::module_& m, PyObject* capture_error);

// Graph capture and replay: graphs, pools, capture status.
void init_graph_bindings(pybind11::module_& m);

// Memory tools: history and snapshots, memory fraction, OOM observers, pinned memory stats.
void init_memory_bindings(pybind11::module_& m);

// Launchers of Inductor's generated kernels on accel streams (torch_accel/_inductor).
void init_inductor_bindings(pybind11::module_& m);

// torch.distributed's accel backend (accl) over a Gloo backend.
void init_distributed_bindings(pybind11::module_& m);

}  // namespace accel::python
