// The host driver's graphs: the DAG a capture recorded, its executable form, and replay.
//
// Replay runs a graph as one task on the replay stream. A graph whose nodes form one chain runs
// them in order on the stream's worker. A graph with independent branches (captured on several
// streams, forked and joined through events) runs them concurrently: the replaying worker and
// helper threads take nodes whose dependencies have completed, in capture order among the ready
// ones, as CUDA runs a graph's independent kernels at once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/drivers/host/host_stream.h"

namespace accel::rt::host {

struct HostGraph {
  int device = 0;
  std::shared_ptr<std::vector<Node>> nodes;
};

// Ends the capture whose origin is `origin`: every joined stream leaves it. Throws CaptureError
// (CaptureUnjoined) if a joined stream's work was not joined back into the origin.
HostGraph* end_capture(HostStream& origin);

// Writes the graph's nodes and dependencies as a Graphviz dot file.
void write_dot(const HostGraph& graph, const char* path);

class Exec {
 public:
  explicit Exec(std::shared_ptr<std::vector<Node>> nodes);
  // Runs every node once, respecting dependencies; rethrows the first failure after the nodes
  // already running have finished (no node that depends on a failed one runs).
  void run();
  // The most nodes that can run at once (1: a chain).
  int width() const { return width_; }

 private:
  void run_parallel();

  std::shared_ptr<std::vector<Node>> nodes_;
  std::vector<std::vector<uint32_t>> successors_;
  std::vector<uint32_t> dep_counts_;
  int width_ = 1;
  // Launches of one executable graph never overlap (as with cudaGraphLaunch).
  std::mutex run_mutex_;
};

}  // namespace accel::rt::host
