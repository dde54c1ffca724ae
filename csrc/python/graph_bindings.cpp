// Bindings of the runtime's graph capture and replay (torch.accel.graphs builds on these).
//
// Graphs are passed to Python as the bits of their checked runtime handle: a destroyed graph's
// handle raises InvalidHandleError (torch_accel.AccelError) when used, never touches freed
// memory. Streams are named by (device, stream id), the fields of torch.Stream.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "device/graph.h"
#include "python/bindings.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace rt = accel::rt;

namespace accel::python {
namespace {

rt::Graph graph_of(uint64_t bits) {
  return rt::Graph::from_bits(bits);
}

rt::Stream stream_of(int device, int64_t id) {
  return rt::Stream::from_id(device, static_cast<uint64_t>(id));
}

rt::CaptureMode mode_of(const std::string& mode) {
  if (mode == "global") return rt::CaptureMode::Global;
  if (mode == "thread_local") return rt::CaptureMode::ThreadLocal;
  if (mode == "relaxed") return rt::CaptureMode::Relaxed;
  throw py::value_error("capture_error_mode must be 'global', 'thread_local' or 'relaxed', not '" +
                        mode + "'");
}

}  // namespace

void init_graph_bindings(py::module_& m) {
  m.def(
      "_graph_pool_handle", [] { return pool_tuple(rt::graph_pool_handle()); },
      "A new memory pool id that several graphs can capture into.");
  m.def("_graph_create", [] { return rt::graph_create().bits(); });
  m.def(
      "_graph_destroy", [](uint64_t g) { device::graph_destroy(graph_of(g)); }, py::arg("graph"));
  m.def(
      "_graph_capture_begin",
      [](uint64_t g, int device, int64_t stream, PoolTuple pool, const std::string& mode) {
        device::graph_capture_begin(graph_of(g), stream_of(device, stream), pool_of(pool),
                                    mode_of(mode));
      },
      py::arg("graph"), py::arg("device"), py::arg("stream"), py::arg("pool"), py::arg("mode"));
  m.def(
      "_graph_capture_end", [](uint64_t g) { device::graph_capture_end(graph_of(g)); },
      py::arg("graph"));
  m.def(
      "_graph_instantiate", [](uint64_t g) { rt::graph_instantiate(graph_of(g)); },
      py::arg("graph"));
  m.def(
      "_graph_replay",
      [](uint64_t g, int device, int64_t stream) {
        device::graph_replay(graph_of(g), stream_of(device, stream));
      },
      py::arg("graph"), py::arg("device"), py::arg("stream"));
  m.def(
      "_graph_reset", [](uint64_t g) { device::graph_reset(graph_of(g)); }, py::arg("graph"));
  m.def(
      "_graph_pool", [](uint64_t g) { return pool_tuple(rt::graph_pool(graph_of(g))); },
      py::arg("graph"));
  m.def(
      "_graph_node_count", [](uint64_t g) { return rt::graph_node_count(graph_of(g)); },
      py::arg("graph"));
  m.def(
      "_graph_debug_dump",
      [](uint64_t g, const std::string& path) { rt::graph_debug_dump(graph_of(g), path); },
      py::arg("graph"), py::arg("path"));
  m.def("_register_accelerator_graph", &device::register_accelerator_graph,
        "Registers accel with torch.accelerator.Graph where this torch has it; False otherwise.");
  // The C++ class (device/graph.h) as C++ users see it; torch.accel.AccelGraph is the Python API.
  py::class_<device::AccelGraph>(m, "_AccelGraph")
      .def(py::init<bool>(), py::arg("keep_graph") = false)
      .def_static("pool_handle", [] { return pool_tuple(device::AccelGraph::pool_handle()); })
      .def(
          "capture_begin",
          [](device::AccelGraph& g, PoolTuple pool, const std::string& mode) {
            g.capture_begin(pool_of(pool), mode_of(mode));
          },
          py::arg("pool") = PoolTuple{0, 0}, py::arg("mode") = "global")
      .def("capture_end", &device::AccelGraph::capture_end)
      .def("instantiate", &device::AccelGraph::instantiate)
      .def("replay", [](device::AccelGraph& g) { g.replay(); })
      .def("reset", &device::AccelGraph::reset)
      .def("pool", [](const device::AccelGraph& g) { return pool_tuple(g.pool()); })
      .def("num_nodes", &device::AccelGraph::num_nodes)
      .def("enable_debug_mode", &device::AccelGraph::enable_debug_mode)
      .def("debug_dump", &device::AccelGraph::debug_dump, py::arg("path"))
      .def("destroy", &device::AccelGraph::destroy);
  m.def(
      "_stream_capture_status",
      [](int device, int64_t stream) {
        switch (rt::stream_capture_status(stream_of(device, stream))) {
          case rt::CaptureStatus::None: return "none";
          case rt::CaptureStatus::Active: return "active";
          case rt::CaptureStatus::Invalidated: return "invalidated";
        }
        return "none";
      },
      py::arg("device"), py::arg("stream"));
}

}  // namespace accel::python
