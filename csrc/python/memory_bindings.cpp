// Bindings of the memory tools (torch.accel.memory builds on these): allocation history with
// Python stack frames, snapshots in torch.cuda.memory._snapshot()'s layout (so PyTorch's
// memory viewer reads them), the per-process memory fraction, out-of-memory observers, raw
// caching-allocator allocations and pinned host memory statistics.
#include <c10/core/AllocatorConfig.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "device/allocator.h"
#include "python/bindings.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace rt = accel::rt;

// From torch/csrc/profiler/python/combined_traceback.h (libtorch_python), whose header needs
// nlohmann/json, which torch's wheel does not ship: frames as lists of {name, filename, line}.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
// Frees the Python frames of tracebacks that died without the GIL (needs the GIL).
void freeDeadCapturedTracebackFrames();
}  // namespace torch

namespace accel::python {
namespace {

// A pluggable allocator's functions from their addresses (ctypes'), both or neither.
rt::SegmentAllocator segment_allocator(uintptr_t alloc_fn, uintptr_t free_fn) {
  rt::SegmentAllocator a;
  a.alloc = reinterpret_cast<decltype(a.alloc)>(alloc_fn);
  a.free = reinterpret_cast<decltype(a.free)>(free_fn);
  return a;
}

// A Python (and optionally C++) stack captured at an allocation event.
struct TracebackContext final : rt::HistoryContext {
  explicit TracebackContext(std::shared_ptr<torch::CapturedTraceback> tb) : tb(std::move(tb)) {}
  std::string to_string() const override { return "traceback"; }
  std::shared_ptr<torch::CapturedTraceback> tb;
};

// Symbolizes the tracebacks of a snapshot in one pass (as torch.cuda does), then hands out
// each context's frames.
class Frames {
 public:
  void want(const std::shared_ptr<rt::HistoryContext>& ctx) {
    if (const auto* t = dynamic_cast<const TracebackContext*>(ctx.get())) {
      if (index_.emplace(t->tb.get(), tracebacks_.size()).second) {
        tracebacks_.push_back(t->tb.get());
      }
    }
  }
  void symbolize() { frames_ = torch::py_symbolize(tracebacks_); }
  py::object of(const std::shared_ptr<rt::HistoryContext>& ctx) const {
    if (const auto* t = dynamic_cast<const TracebackContext*>(ctx.get())) {
      return frames_.at(index_.at(t->tb.get()));
    }
    return py::list();
  }

 private:
  std::vector<torch::CapturedTraceback*> tracebacks_;
  std::unordered_map<const torch::CapturedTraceback*, size_t> index_;
  std::vector<py::object> frames_;
};

const char* block_state(rt::BlockInfo::State s) {
  switch (s) {
    case rt::BlockInfo::State::ActiveAllocated: return "active_allocated";
    case rt::BlockInfo::State::ActivePendingFree: return "active_pending_free";
    case rt::BlockInfo::State::Inactive: return "inactive";
  }
  return "inactive";
}

py::dict snapshot() {
  torch::freeDeadCapturedTracebackFrames();
  rt::MemorySnapshot snap;
  {
    py::gil_scoped_release no_gil;
    snap = rt::memory_snapshot();
  }
  Frames frames;
  for (const rt::SegmentInfo& seg : snap.segments) {
    for (const rt::BlockInfo& b : seg.blocks) frames.want(b.context);
  }
  for (const auto& trace : snap.device_traces) {
    for (const rt::TraceEntry& e : trace) frames.want(e.context);
  }
  frames.symbolize();

  py::list segments;
  for (const rt::SegmentInfo& seg : snap.segments) {
    py::list blocks;
    for (const rt::BlockInfo& b : seg.blocks) {
      py::dict block;
      block["address"] = b.addr;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["state"] = block_state(b.state);
      block["frames"] = frames.of(b.context);
      blocks.append(block);
    }
    py::dict s;
    s["device"] = seg.device;
    s["address"] = seg.addr;
    s["total_size"] = seg.total_size;
    s["allocated_size"] = seg.allocated_size;
    s["active_size"] = seg.active_size;
    s["requested_size"] = seg.requested_size;
    s["stream"] = seg.stream;
    s["segment_type"] = seg.is_large ? "large" : "small";
    s["segment_pool_id"] = py::cast(pool_tuple(seg.pool));
    s["is_expandable"] = seg.is_expandable;
    s["frames"] = py::list();
    s["blocks"] = blocks;
    segments.append(s);
  }
  py::list traces;
  for (const auto& trace : snap.device_traces) {
    py::list entries;
    for (const rt::TraceEntry& e : trace) {
      py::dict d;
      d["action"] = rt::trace_action_name(e.action);
      d["addr"] = e.addr;
      d["size"] = e.size;
      d["stream"] = e.stream;
      d["time_us"] = e.time_us;
      d["frames"] = frames.of(e.context);
      if (e.action == rt::TraceEntry::Action::Oom) d["device_free"] = e.addr;
      entries.append(d);
    }
    traces.append(entries);
  }
  py::dict settings;
  settings["PYTORCH_ACCEL_ALLOC_CONF"] = "";
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  out["allocator_settings"] = settings;
  return out;
}

py::dict host_stats() {
  const rt::HostStats s = rt::host_memory_stats();
  py::dict d;
  const auto put = [&](const char* name, const rt::Stat& st) {
    const std::string n(name);
    d[py::str(n + ".current")] = st.current;
    d[py::str(n + ".peak")] = st.peak;
    d[py::str(n + ".allocated")] = st.allocated;
    d[py::str(n + ".freed")] = st.freed;
  };
  put("allocations", s.allocation);
  put("segment", s.segment);
  put("allocated_bytes", s.allocated_bytes);
  put("reserved_bytes", s.reserved_bytes);
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  return d;
}

}  // namespace

void init_memory_bindings(py::module_& m) {
  m.def(
      "_record_memory_history",
      [](bool enabled, bool with_context, bool python_stacks, bool cpp_stacks, size_t max_entries,
         const std::string& context) {
        const rt::ContextLevel level = context == "state"   ? rt::ContextLevel::State
                                       : context == "alloc" ? rt::ContextLevel::Alloc
                                                            : rt::ContextLevel::All;
        rt::ContextRecorder recorder;
        if (enabled && with_context) {
          recorder = [python_stacks, cpp_stacks]() -> std::shared_ptr<rt::HistoryContext> {
            return std::make_shared<TracebackContext>(torch::CapturedTraceback::gather(
                python_stacks, /*script=*/python_stacks, cpp_stacks));
          };
        }
        rt::record_memory_history(enabled, std::move(recorder), max_entries, level);
        torch::freeDeadCapturedTracebackFrames();
      },
      py::arg("enabled"), py::arg("with_context"), py::arg("python_stacks"), py::arg("cpp_stacks"),
      py::arg("max_entries"), py::arg("context") = "all");
  m.def("_memory_snapshot", &snapshot);
  m.def(
      "_set_memory_fraction", [](double f, int device) { rt::set_memory_fraction(f, device); },
      py::arg("fraction"), py::arg("device"));
  m.def(
      "_get_memory_fraction", [](int device) { return rt::get_memory_fraction(device); },
      py::arg("device"));
  // torch.accel.memory._set_allocator_settings: PyTorch's parser, then accel's allocator.
  m.def(
      "_set_allocator_settings",
      [](const std::string& settings) {
        c10::CachingAllocator::setAllocatorSettings(settings);
        device::apply_allocator_config();
      },
      py::arg("settings"));
  m.def("_get_allocator_settings", [] {
    const rt::AllocatorSettings s = rt::allocator_settings();
    py::dict d;
    d["max_split_size"] =
        s.max_split_size == SIZE_MAX ? -1 : static_cast<int64_t>(s.max_split_size);
    d["max_non_split_rounding"] = s.max_non_split_rounding;
    d["garbage_collection_threshold"] = s.garbage_collection_threshold;
    d["roundup_power2_divisions"] = s.roundup_power2_divisions;
    d["expandable_segments"] = s.expandable_segments;
    return d;
  });
  m.def(
      "_set_memory_caching", [](bool enabled) { rt::set_memory_caching(enabled, -2); },
      py::arg("enabled"));
  m.def(
      "_memory_caching", [](int device) { return rt::memory_caching(device); }, py::arg("device"));
  m.def(
      "_attach_oom_observer",
      [](py::function observer) {
        auto keep = std::make_shared<py::function>(std::move(observer));
        rt::attach_oom_observer(
            [keep](int device, size_t requested, size_t allocated, size_t free) {
              py::gil_scoped_acquire gil;
              try {
                (*keep)(device, requested, allocated, free);
              } catch (py::error_already_set& e) {
                // The out-of-memory error that follows is what the caller must see.
                e.discard_as_unraisable("torch.accel out-of-memory observer");
              }
            });
      },
      py::arg("observer"));
  m.def(
      "_caching_allocator_alloc",
      [](size_t size, int device, int64_t stream) {
        void* p = rt::malloc(size, rt::Stream::from_id(device, static_cast<uint64_t>(stream)));
        return reinterpret_cast<uintptr_t>(p);
      },
      py::arg("size"), py::arg("device"), py::arg("stream"));
  m.def(
      "_caching_allocator_delete", [](uintptr_t p) { rt::free(reinterpret_cast<void*>(p)); },
      py::arg("ptr"));
  m.def(
      "_mem_pool_create",
      [](int device, bool use_on_oom, bool no_split, uintptr_t alloc_fn, uintptr_t free_fn) {
        return pool_tuple(rt::mem_pool_create(
            device, rt::MemPoolOptions{.use_on_oom = use_on_oom,
                                       .no_split = no_split,
                                       .allocator = segment_allocator(alloc_fn, free_fn)}));
      },
      py::arg("device"), py::arg("use_on_oom"), py::arg("no_split"), py::arg("alloc_fn") = 0,
      py::arg("free_fn") = 0);
  // torch.cuda.memory.change_current_allocator: the functions' addresses (0, 0: the driver's).
  m.def(
      "_set_device_allocator",
      [](uintptr_t alloc_fn, uintptr_t free_fn) {
        rt::set_device_allocator(segment_allocator(alloc_fn, free_fn));
      },
      py::arg("alloc_fn"), py::arg("free_fn"));
  m.def("_device_allocator", [] {
    const rt::SegmentAllocator a = rt::device_allocator();
    return std::make_pair(reinterpret_cast<uintptr_t>(a.alloc),
                          reinterpret_cast<uintptr_t>(a.free));
  });
  m.def(
      "_mem_pool_release",
      [](int device, PoolTuple p) { rt::mem_pool_release(device, pool_of(p)); }, py::arg("device"),
      py::arg("pool"));
  m.def(
      "_mem_pool_use_count",
      [](int device, PoolTuple p) { return rt::mem_pool_use_count(device, pool_of(p)); },
      py::arg("device"), py::arg("pool"));
  m.def(
      "_mem_pool_begin_allocate",
      [](int device, PoolTuple p) { rt::mem_pool_begin_allocate(device, pool_of(p)); },
      py::arg("device"), py::arg("pool"));
  m.def(
      "_mem_pool_end_allocate",
      [](int device, PoolTuple p) { rt::mem_pool_end_allocate(device, pool_of(p)); },
      py::arg("device"), py::arg("pool"));
  m.def("_host_memory_stats", &host_stats);
  m.def("_host_reset_peak_stats", [] { rt::host_reset_peak_stats(); });
  m.def("_host_reset_accumulated_stats", [] { rt::host_reset_accumulated_stats(); });
  m.def("_host_empty_cache", [] { rt::host_empty_cache(); });
}

}  // namespace accel::python
