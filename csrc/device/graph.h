// Graph capture and replay for C++ users of accel (what at::cuda::CUDAGraph is for CUDA), and
// the calls the Python API (torch.accel.graphs) makes: the runtime's graph objects plus what
// PyTorch needs around them (random operators drawing fresh numbers per replay, graph_rng.h).
// Runtime errors become PyTorch exceptions (common.h); capture errors are
// torch_accel.CaptureError from Python.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/runtime.h"

namespace accel::device {

// What the layer above does around captures made through these calls: the cuda executor sends
// PyTorch's CUDA allocations of the capture (kernels' temporaries) to a private pool of the CUDA
// allocator, kept until the graph is reset or destroyed (csrc/aten/executor.cpp). `begin` runs
// once the capture has begun, `end` once it ended (also when it failed), `release` when the
// graph's memory may go.
struct CaptureHooks {
  void (*begin)(rt::Graph graph, rt::Stream stream) = nullptr;
  void (*end)(rt::Graph graph) = nullptr;
  void (*release)(rt::Graph graph) = nullptr;
};
void set_capture_hooks(CaptureHooks hooks);

// The runtime graph calls with random-operator support; `graph_replay` instantiates first.
// They throw the runtime's errors (rt::Error); AccelGraph translates them.
void graph_capture_begin(rt::Graph graph, rt::Stream stream, rt::PoolId pool, rt::CaptureMode mode);
void graph_capture_end(rt::Graph graph);
void graph_replay(rt::Graph graph, rt::Stream stream);
void graph_reset(rt::Graph graph);
void graph_destroy(rt::Graph graph);

class AccelGraph {
 public:
  // keep_graph: instantiate at the first replay (or instantiate()) rather than at capture_end.
  explicit AccelGraph(bool keep_graph = false);
  ~AccelGraph();
  AccelGraph(const AccelGraph&) = delete;
  AccelGraph& operator=(const AccelGraph&) = delete;

  // A pool id several graphs can capture into.
  static rt::PoolId pool_handle();

  // Captures the current stream of the current device (pool: {} for a private one).
  void capture_begin(rt::PoolId pool = {}, rt::CaptureMode mode = rt::CaptureMode::Global);
  void capture_begin(rt::Stream stream, rt::PoolId pool, rt::CaptureMode mode);
  void capture_end();
  void instantiate();
  // On the current stream of the graph's device.
  void replay();
  void replay(rt::Stream stream);
  void reset();
  rt::PoolId pool() const;
  std::size_t num_nodes() const;
  // debug_dump needs debug mode (or keep_graph), as on CUDA.
  void enable_debug_mode() { debug_ = true; }
  void debug_dump(const std::string& path) const;
  // Frees the graph now; any later call throws.
  void destroy();

 private:
  rt::Graph live(const char* call) const;

  rt::Graph graph_;
  bool destroyed_ = false;
  bool keep_graph_;
  bool debug_ = false;
  int device_ = -1;
};

// Registers AccelGraph as torch.accelerator.Graph's implementation for accel, where the torch
// accel was built against has that API (2.12 and later); false (nothing done) otherwise. Call
// after the PrivateUse1 backend is named "accel".
bool register_accelerator_graph();

}  // namespace accel::device
