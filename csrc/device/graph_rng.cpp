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
  // cuda executor: the same two numbers in pinned memory, read by the graph's kernels, and the
  // CUDA generator they draw from.
  int64_t* seed_offset = nullptr;
  std::unique_ptr<CapturedCudaRng> cuda;

  ReplayRng() = default;
  ReplayRng(const ReplayRng&) = delete;
  ReplayRng& operator=(const ReplayRng&) = delete;
  ~ReplayRng() {
    cuda.reset();
    if (seed_offset == nullptr) return;
    try {
      rt::host_free(seed_offset);  // reused once the replay streams recorded on it pass here
    } catch (...) {                // NOLINT(bugprone-empty-catch): the runtime is gone at exit
    }
  }
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

namespace {

// The record of `accel_gen` in the graph capture `capture_id` records into (made at its first
// draw), then `draw(rng)` under the registry's lock; throws CaptureError for a capture not begun
// through graph_rng_capture_begin.
template <class Draw>
std::shared_ptr<ReplayRng> graph_draw(const at::Generator& accel_gen, rt::Stream stream,
                                      uint64_t capture_id, const char* op, Draw&& draw) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.m);
    const auto g = r.capture_to_graph.find(capture_id);
    if (g != r.capture_to_graph.end()) {
      std::vector<std::shared_ptr<ReplayRng>>& rngs = r.graphs[g->second].rngs;
      std::shared_ptr<ReplayRng> rng;
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
      draw(*rng);
      return rng;
    }
  }
  call([&] {
    rt::capture_refuse(stream, op,
                       "random operators are graph-safe only in captures begun through "
                       "torch.accel.AccelGraph (or torch.accel.graph)");
  });
  TORCH_CHECK(false, "accel: ", op, ": the capture was not refused");  // unreachable
}

}  // namespace

at::Generator captured_cpu_generator(const at::Generator& accel_gen, rt::Stream stream,
                                     uint64_t capture_id, const char* op) {
  uint64_t k = 0;
  std::shared_ptr<ReplayRng> rng =
      graph_draw(accel_gen, stream, capture_id, op, [&](ReplayRng& r) { k = r.draws++; });
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

at::Generator captured_cuda_generator(const at::Generator& accel_gen, rt::Stream stream,
                                      uint64_t capture_id, const char* op,
                                      CapturedCudaRngFactory make) {
  std::shared_ptr<ReplayRng> rng = graph_draw(accel_gen, stream, capture_id, op, [&](ReplayRng& r) {
    if (r.cuda) return;
    // Pinned memory allocated during the capture: the runtime relaxes the capture mode for it.
    auto* seed_offset =
        static_cast<int64_t*>(call([] { return rt::host_malloc(2 * sizeof(int64_t)); }));
    try {
      r.cuda = make(stream.device(), seed_offset);
    } catch (...) {
      call([&] { rt::host_free(seed_offset); });
      throw;
    }
    r.seed_offset = seed_offset;
  });
  return rng->cuda->generator();
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
    if (rng->cuda) {
      const auto [seed, base] = take_philox_offsets(rng->accel, rng->cuda->increment());
      int64_t* seed_offset = rng->seed_offset;
      call([&, seed = seed, base = base] {
        rt::host_record_stream(seed_offset, stream);  // its kernels read it until they end
        // The task holds no reference to the record: a host task on cuda must not call into the
        // runtime, as dropping the record's last reference would (host_free). Freed, the memory
        // is reused only after this stream passed the free.
        rt::launch_host_func(stream, rt::Task([seed_offset, seed, base] {
                               seed_offset[0] = static_cast<int64_t>(seed);
                               seed_offset[1] = static_cast<int64_t>(base);
                             }),
                             "replay seed");
      });
      continue;
    }
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
