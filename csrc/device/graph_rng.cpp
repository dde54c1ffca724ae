#include "device/graph_rng.h"

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "device/common.h"
#include "device/generator.h"

namespace accel::device {
namespace {

// One accel generator's draws in one graph.
struct ReplayRng {
  at::Generator accel;  // the generator the graph draws from
  uint64_t draws = 0;   // recorded draws (set during the capture only)
  // The (seed, base offset) of the replay running now: written by the task before the graph,
  // read by the graph's tasks, all in order on the replay stream.
  std::atomic<uint64_t> seed{0};
  std::atomic<uint64_t> base{0};
};

struct GraphRng {
  std::vector<std::shared_ptr<ReplayRng>> rngs;
};

struct Registry {
  std::mutex m;
  std::map<uint64_t, uint64_t> capture_to_graph;  // capture id -> graph handle bits
  std::map<uint64_t, GraphRng> graphs;            // graph handle bits -> its generators
};

Registry& registry() {
  static Registry* r = new Registry();  // used by stream workers up to process exit
  return *r;
}

}  // namespace

void graph_rng_capture_begin(rt::Graph graph, uint64_t capture_id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.capture_to_graph[capture_id] = graph.bits();
  r.graphs[graph.bits()].rngs.clear();
}

void graph_rng_capture_end(rt::Graph graph) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  for (auto it = r.capture_to_graph.begin(); it != r.capture_to_graph.end();) {
    it = it->second == graph.bits() ? r.capture_to_graph.erase(it) : std::next(it);
  }
}

void graph_rng_forget(rt::Graph graph) {
  graph_rng_capture_end(graph);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.graphs.erase(graph.bits());
}

at::Generator captured_cpu_generator(const at::Generator& accel_gen, rt::Stream stream,
                                     uint64_t capture_id, const char* op) {
  std::shared_ptr<ReplayRng> rng;
  uint64_t k = 0;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.m);
    const auto g = r.capture_to_graph.find(capture_id);
    if (g != r.capture_to_graph.end()) {
      std::vector<std::shared_ptr<ReplayRng>>& rngs = r.graphs[g->second].rngs;
      for (const auto& existing : rngs) {
        if (existing->accel.unsafeGetGeneratorImpl() == accel_gen.unsafeGetGeneratorImpl()) {
          rng = existing;
        }
      }
      if (!rng) {
        rng = std::make_shared<ReplayRng>();
        rng->accel = accel_gen;
        rngs.push_back(rng);
      }
      k = rng->draws++;
    }
  }
  if (!rng) {
    call([&] {
      rt::capture_refuse(stream, op,
                         "random operators are graph-safe only in captures begun through "
                         "torch.accel.AccelGraph (or torch.accel.graph)");
    });
  }
  at::Generator cpu = at::detail::createCPUGenerator();
  // Recorded before the operator's own task: each replay first gives the operator's generator
  // the state of its draw.
  call(
      [&] {
        rt::launch_host_func(stream, rt::Task([rng, k, cpu] {
                               set_cpu_generator_state(cpu, rng->seed.load(), rng->base.load() + k);
                             }),
                             "random generator state");
      },
      op);
  return cpu;
}

void graph_rng_before_replay(rt::Graph graph, rt::Stream stream) {
  std::vector<std::shared_ptr<ReplayRng>> rngs;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.m);
    const auto it = r.graphs.find(graph.bits());
    if (it == r.graphs.end()) return;
    rngs = it->second.rngs;
  }
  for (const auto& rng : rngs) {
    const auto [seed, base] = take_offsets(rng->accel, rng->draws);
    call([&, seed = seed, base = base] {
      rt::launch_host_func(stream, rt::Task([rng, seed, base] {
                             rng->seed.store(seed);
                             rng->base.store(base);
                           }),
                           "replay seed");
    });
  }
}

}  // namespace accel::device
