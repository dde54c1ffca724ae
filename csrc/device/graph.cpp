#include "device/graph.h"

#include <c10/util/Exception.h>

#include "device/common.h"
#include "device/graph_rng.h"

namespace accel::device {

namespace {
CaptureHooks g_hooks;  // set once, when the layer above loads
}  // namespace

void set_capture_hooks(CaptureHooks hooks) {
  g_hooks = hooks;
}

void graph_capture_begin(rt::Graph graph, rt::Stream stream, rt::PoolId pool,
                         rt::CaptureMode mode) {
  rt::graph_capture_begin(graph, stream, pool, mode);
  // Random operators of the capture draw per replay (graph_rng.h).
  graph_rng_capture_begin(graph, rt::stream_capture_id(stream));
  if (g_hooks.begin != nullptr) {
    try {
      g_hooks.begin(graph, stream);
    } catch (...) {
      graph_rng_capture_end(graph);
      try {
        rt::graph_capture_end(graph);  // discards what was begun
      } catch (...) {  // NOLINT(bugprone-empty-catch): the hook's error is the one to report
      }
      throw;
    }
  }
}

void graph_capture_end(rt::Graph graph) {
  graph_rng_capture_end(graph);
  try {
    rt::graph_capture_end(graph);
  } catch (...) {
    if (g_hooks.end != nullptr) g_hooks.end(graph);
    throw;
  }
  if (g_hooks.end != nullptr) g_hooks.end(graph);
}

void graph_replay(rt::Graph graph, rt::Stream stream) {
  rt::graph_instantiate(graph);  // raises before any state changes if it cannot run
  graph_rng_before_replay(graph, stream);
  rt::graph_replay(graph, stream);
}

void graph_reset(rt::Graph graph) {
  rt::graph_reset(graph);
  graph_rng_forget(graph);
  if (g_hooks.release != nullptr) g_hooks.release(graph);
}

void graph_destroy(rt::Graph graph) {
  rt::graph_destroy(graph);
  graph_rng_forget(graph);
  if (g_hooks.release != nullptr) g_hooks.release(graph);
}

AccelGraph::AccelGraph(bool keep_graph)
    : graph_(call([] { return rt::graph_create(); })), keep_graph_(keep_graph) {}

AccelGraph::~AccelGraph() {
  try {
    destroy();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

rt::PoolId AccelGraph::pool_handle() {
  return call([] { return rt::graph_pool_handle(); });
}

rt::Graph AccelGraph::live(const char* what) const {
  TORCH_CHECK(!destroyed_, "AccelGraph::", what, ": the graph was destroyed; create a new one");
  return graph_;
}

void AccelGraph::capture_begin(rt::PoolId pool, rt::CaptureMode mode) {
  capture_begin(call([] { return rt::current_stream(); }), pool, mode);
}

void AccelGraph::capture_begin(rt::Stream stream, rt::PoolId pool, rt::CaptureMode mode) {
  call([&] { device::graph_capture_begin(live("capture_begin"), stream, pool, mode); });
  device_ = stream.device();
}

void AccelGraph::capture_end() {
  const rt::Graph g = live("capture_end");
  call([&] {
    device::graph_capture_end(g);
    if (!keep_graph_) rt::graph_instantiate(g);
  });
}

void AccelGraph::instantiate() {
  const rt::Graph g = live("instantiate");
  call([&] { rt::graph_instantiate(g); });
}

void AccelGraph::replay() {
  live("replay");
  TORCH_CHECK(device_ >= 0, "AccelGraph::replay: the graph is empty; capture work into it first");
  replay(call([&] { return rt::current_stream(device_); }));
}

void AccelGraph::replay(rt::Stream stream) {
  call([&] { device::graph_replay(live("replay"), stream); });
}

void AccelGraph::reset() {
  call([&] { device::graph_reset(live("reset")); });
}

rt::PoolId AccelGraph::pool() const {
  const rt::Graph g = live("pool");
  return call([&] { return rt::graph_pool(g); });
}

std::size_t AccelGraph::num_nodes() const {
  const rt::Graph g = live("num_nodes");
  return call([&] { return rt::graph_node_count(g); });
}

void AccelGraph::debug_dump(const std::string& path) const {
  const rt::Graph g = live("debug_dump");
  TORCH_CHECK(debug_ || keep_graph_,
              "AccelGraph::debug_dump: debug mode is off; call enable_debug_mode() before the "
              "capture (or create the graph with keep_graph=true)");
  call([&] { rt::graph_debug_dump(g, path); });
}

void AccelGraph::destroy() {
  if (destroyed_) return;
  destroyed_ = true;
  call([&] { device::graph_destroy(graph_); });
}

}  // namespace accel::device

// torch.accelerator.Graph (PyTorch 2.12 and later): an implementation of its interface over
// AccelGraph, registered under the PrivateUse1 backend's name once that name is set. Built only
// against a torch that has the interface; 2.11 has none.
#if __has_include(<ATen/core/GraphImplInterface.h>)
#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>

namespace accel::device {
namespace {

rt::CaptureMode capture_mode_of(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal: return rt::CaptureMode::ThreadLocal;
    case at::GraphCaptureMode::Relaxed: return rt::CaptureMode::Relaxed;
    default: return rt::CaptureMode::Global;  // Default and Global: CUDA's default
  }
}

struct AcceleratorGraph final : at::GraphImplInterface {
  explicit AcceleratorGraph(const at::GraphImplArgs& args) : graph(args.keep_graph) {}
  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    graph.capture_begin(rt::PoolId{pool.first, pool.second}, capture_mode_of(mode));
  }
  void capture_end() override { graph.capture_end(); }
  void instantiate() override { graph.instantiate(); }
  void replay() override { graph.replay(); }
  void reset() override { graph.reset(); }
  at::MempoolId_t pool() const override {
    const rt::PoolId p = graph.pool();
    return {p.first, p.second};
  }
  AccelGraph graph;
};

}  // namespace

bool register_accelerator_graph() {
  const std::string key = c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false);
  if (!at::GraphImplRegistry()->Has(key)) {
    at::GraphImplRegistry()->Register(key, [](const at::GraphImplArgs& args) {
      return std::unique_ptr<at::GraphImplInterface>(new AcceleratorGraph(args));
    });
  }
  return true;
}

}  // namespace accel::device
#else
namespace accel::device {
bool register_accelerator_graph() {
  return false;  // this torch has no torch.accelerator.Graph
}
}  // namespace accel::device
#endif
