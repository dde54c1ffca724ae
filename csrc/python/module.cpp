// torch_accel._C: the Python bindings of the runtime. The only code that links Python.
//
// For now it exposes the runtime's version, devices and memory statistics, and in `_rt` a
// small, checked runtime API (streams, events, device buffers, a host kernel) used by the
// quickstart and the Python tests. Nothing reachable from Python can crash the process: every
// runtime error becomes a Python exception and device pointers never leave C++.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>

#include "kernels/host/blas1.h"
#include "python/bindings.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace rt = accel::rt;

namespace {

// Exception types, kept for the life of the process (never released at interpreter exit).
PyObject* g_accel_error = nullptr;
PyObject* g_capture_error = nullptr;

// --- memory statistics with the flat keys of torch.cuda.memory_stats -----------------------

// prefix.current, prefix.peak, prefix.allocated, prefix.freed
void add_stat(py::dict& out, const std::string& prefix, const rt::Stat& s) {
  out[py::str(prefix + ".current")] = s.current;
  out[py::str(prefix + ".peak")] = s.peak;
  out[py::str(prefix + ".allocated")] = s.allocated;
  out[py::str(prefix + ".freed")] = s.freed;
}

void add_stat_array(py::dict& out, const char* name, const rt::StatArray& a) {
  static const char* const kPools[] = {"all", "small_pool", "large_pool"};
  for (int t = 0; t < rt::kNumStatTypes; ++t) {
    add_stat(out, std::string(name) + "." + kPools[t], a[t]);
  }
}

py::dict stats_to_dict(const rt::DeviceStats& s) {
  py::dict d;
  add_stat_array(d, "allocation", s.allocation);
  add_stat_array(d, "segment", s.segment);
  add_stat_array(d, "active", s.active);
  add_stat_array(d, "inactive_split", s.inactive_split);
  add_stat_array(d, "allocated_bytes", s.allocated_bytes);
  add_stat_array(d, "reserved_bytes", s.reserved_bytes);
  add_stat_array(d, "active_bytes", s.active_bytes);
  add_stat_array(d, "inactive_split_bytes", s.inactive_split_bytes);
  add_stat_array(d, "requested_bytes", s.requested_bytes);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["max_split_size"] = s.max_split_size;
  add_stat(d, "oversize_allocations", s.oversize_allocations);
  add_stat(d, "oversize_segments", s.oversize_segments);
  return d;
}

int device_or_current(std::optional<int> device) {
  return device ? *device : rt::get_device();
}

// --- the small runtime API of _rt ---------------------------------------------------------

class PyStream {
 public:
  // A new stream owned by this object (destroyed with it).
  PyStream(std::optional<int> device, int priority)
      : stream_(rt::stream_create(device_or_current(device), priority)), owned_(true) {}
  explicit PyStream(rt::Stream s) : stream_(s), owned_(false) {}
  ~PyStream() {
    if (!owned_) return;
    try {
      rt::stream_destroy(stream_);
    } catch (...) {  // a failed task is reported by whoever synchronizes; never throw here
    }
  }
  PyStream(const PyStream&) = delete;
  PyStream& operator=(const PyStream&) = delete;

  rt::Stream get() const { return stream_; }
  int device() const { return stream_.device(); }
  uint64_t id() const { return stream_.id(); }
  int priority() const { return rt::stream_priority(stream_); }
  bool query() const { return rt::stream_query(stream_); }
  void synchronize() const { rt::stream_synchronize(stream_); }
  std::string repr() const {
    return "<torch_accel._C._rt.Stream device=" + std::to_string(device()) +
           " id=" + std::to_string(id()) + ">";
  }

 private:
  rt::Stream stream_;
  bool owned_;
};

rt::Stream stream_or_current(const PyStream* s, int device) {
  return s != nullptr ? s->get() : rt::current_stream(device);
}

class PyEvent {
 public:
  PyEvent(std::optional<int> device, bool enable_timing)
      : event_(rt::event_create(device_or_current(device), enable_timing)) {}
  ~PyEvent() {
    try {
      rt::event_destroy(event_);
    } catch (...) {
    }
  }
  PyEvent(const PyEvent&) = delete;
  PyEvent& operator=(const PyEvent&) = delete;

  int device() const { return rt::event_device(event_); }
  void record(const PyStream* s) { rt::event_record(event_, stream_or_current(s, device())); }
  void wait(const PyStream* s) { rt::stream_wait_event(stream_or_current(s, device()), event_); }
  bool query() const { return rt::event_query(event_); }
  void synchronize() const { rt::event_synchronize(event_); }
  float elapsed_time(const PyEvent& end) const {
    return rt::event_elapsed_time(event_, end.event_);
  }

 private:
  rt::Event event_;
};

// Device memory owned by a Python object. The pointer never reaches Python as something that
// could be dereferenced; `ptr` is informational.
class DeviceBuffer {
 public:
  DeviceBuffer(int64_t nbytes, const PyStream* stream, std::optional<int> device) {
    if (nbytes < 0) {
      throw py::value_error("DeviceBuffer: nbytes must be >= 0, got " + std::to_string(nbytes));
    }
    stream_ = stream != nullptr ? stream->get() : rt::current_stream(device_or_current(device));
    if (stream != nullptr && device && *device != stream_.device()) {
      throw py::value_error("DeviceBuffer: the stream is on device " +
                            std::to_string(stream_.device()) + ", not on device " +
                            std::to_string(*device));
    }
    nbytes_ = static_cast<std::size_t>(nbytes);
    ptr_ = rt::malloc(nbytes_, stream_);
  }
  ~DeviceBuffer() {
    try {
      release();
    } catch (...) {
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void free() {
    if (freed_) throw py::value_error("DeviceBuffer.free(): the buffer was already freed");
    release();
  }
  std::size_t nbytes() const { return nbytes_; }
  int device() const { return stream_.device(); }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(ptr_); }
  bool freed() const { return freed_; }

  // The memory to work on from `stream`; records the use so the block outlives the work.
  void* use(rt::Stream stream, const char* what) {
    if (freed_) throw py::value_error(std::string(what) + ": the buffer was freed");
    if (stream.device() != device()) {
      throw py::value_error(std::string(what) + ": the buffer is on device " +
                            std::to_string(device()) + " but the stream is on device " +
                            std::to_string(stream.device()));
    }
    if (ptr_ != nullptr && stream != stream_) rt::record_stream(ptr_, stream);
    return ptr_;
  }

  void copy_from_host(const py::buffer& src, const PyStream* s, bool non_blocking) {
    py::buffer_info info = src.request();
    const std::size_t n = check_host(info, "copy_from_host");
    const rt::Stream stream = stream_or_current(s, device());
    void* dst = use(stream, "copy_from_host");
    if (n == 0) return;
    py::gil_scoped_release release;
    rt::memcpy_async(dst, info.ptr, n, rt::CopyKind::HostToDevice, stream);
    if (!non_blocking) rt::stream_synchronize(stream);
  }

  void copy_to_host(const py::buffer& dst, const PyStream* s) {
    py::buffer_info info = dst.request(/*writable=*/true);
    const std::size_t n = check_host(info, "copy_to_host");
    const rt::Stream stream = stream_or_current(s, device());
    void* src = use(stream, "copy_to_host");
    if (n == 0) return;
    py::gil_scoped_release release;
    // Pageable destination: the copy has completed when this returns.
    rt::memcpy_async(info.ptr, src, n, rt::CopyKind::DeviceToHost, stream);
  }

 private:
  std::size_t check_host(const py::buffer_info& info, const char* what) const {
    const auto n = static_cast<std::size_t>(info.size * info.itemsize);
    bool contiguous = true;
    py::ssize_t expected = info.itemsize;
    for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
      if (info.shape[i] > 1 && info.strides[i] != expected) contiguous = false;
      expected *= info.shape[i];
    }
    if (!contiguous)
      throw py::value_error(std::string(what) + ": the host buffer is not contiguous");
    if (n != nbytes_) {
      throw py::value_error(std::string(what) + ": the host buffer has " + std::to_string(n) +
                            " bytes but the device buffer has " + std::to_string(nbytes_));
    }
    return n;
  }

  void release() {
    if (freed_) return;
    freed_ = true;
    rt::free(ptr_);
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
  rt::Stream stream_;
  bool freed_ = false;
};

// y = alpha * x + y over float32 buffers, enqueued on the stream.
void axpy(float alpha, DeviceBuffer& x, DeviceBuffer& y, const PyStream* s) {
  if (x.nbytes() != y.nbytes()) {
    throw py::value_error("axpy: x has " + std::to_string(x.nbytes()) + " bytes, y has " +
                          std::to_string(y.nbytes()));
  }
  if (x.nbytes() % sizeof(float) != 0) {
    throw py::value_error("axpy: the buffers do not hold whole float32 values");
  }
  const rt::Stream stream = stream_or_current(s, y.device());
  const auto* xp = static_cast<const float*>(x.use(stream, "axpy"));
  auto* yp = static_cast<float*>(y.use(stream, "axpy"));
  const std::size_t n = x.nbytes() / sizeof(float);
  if (n == 0) return;
  if (!rt::device_memory_host_accessible()) {
    throw rt::NotSupportedError(
        "axpy: the " + std::string(rt::driver_name()) + " driver has no host kernels", __FILE__,
        __LINE__);
  }
  rt::launch_host_func(stream, [=] { accel::kernels::host::axpy(alpha, xp, yp, n); });
}

py::dict properties_to_dict(const rt::DeviceProperties& p) {
  py::dict d;
  d["name"] = p.name;
  d["driver"] = p.driver;
  d["total_memory"] = p.total_memory;
  d["compute_units"] = p.compute_units;
  d["major"] = p.major;
  d["minor"] = p.minor;
  d["max_threads_per_compute_unit"] = p.max_threads_per_compute_unit;
  d["max_kernel_args"] = p.max_kernel_args;
  d["max_kernel_buffers"] = p.max_kernel_buffers;
  d["integrated"] = p.integrated;
  // As torch.cuda prints a UUID: 8-4-4-4-12 lowercase hex digits.
  std::string uuid;
  for (std::size_t i = 0; i < p.uuid.size(); ++i) {
    static const char kHex[] = "0123456789abcdef";
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    uuid += kHex[p.uuid[i] >> 4];
    uuid += kHex[p.uuid[i] & 15];
  }
  d["uuid"] = uuid;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_accel native bindings";
  m.attr("__version__") = rt::version();

  g_accel_error = py::exception<rt::Error>(m, "AccelError", PyExc_RuntimeError).release().ptr();
  g_capture_error =
      py::exception<rt::CaptureError>(m, "CaptureError", g_accel_error).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    // torch's own type, so `except torch.OutOfMemoryError` works as it does for CUDA.
    const auto set_torch_oom = [](const char* message) {
      PyErr_SetString(py::module_::import("torch").attr("OutOfMemoryError").ptr(), message);
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rt::OutOfMemoryError& e) {
      set_torch_oom(e.what());
    } catch (const rt::CaptureError& e) {
      PyErr_SetString(g_capture_error, e.what());
    } catch (const rt::DeviceLostError& e) {  // torch.AcceleratorError, as for CUDA's sticky errors
      PyErr_SetString(py::module_::import("torch").attr("AcceleratorError").ptr(), e.what());
    } catch (const rt::Error& e) {
      PyErr_SetString(g_accel_error, e.what());
    } catch (const c10::Error&) {
      // PyTorch's own mapping (ValueError, IndexError, torch.OutOfMemoryError,
      // torch.distributed.DistBackendError, ...): pybind's translators are process-wide, so a
      // coarser one here would also take over the errors of torch's own bindings.
      torch::translate_exception_to_python(p);
    }
  });
  accel::python::init_torch_bindings(m, g_capture_error);
  accel::python::init_graph_bindings(m);
  accel::python::init_memory_bindings(m);
  accel::python::init_inductor_bindings(m);
  accel::python::init_distributed_bindings(m);

  m.def("runtime_version", [] { return std::string(rt::version()); });
  m.def("device_count", &rt::device_count_noexcept,
        "Number of accel devices; 0 when the runtime cannot start (see init_error()).");
  m.def("is_available", [] { return rt::device_count_noexcept() > 0; });
  m.def("is_initialized", &rt::is_initialized);
  m.def("init_error", &rt::init_error);
  m.def("in_bad_fork", &rt::in_bad_fork);
  m.def("init", &rt::init);
  m.def("driver_name", [] { return std::string(rt::driver_name()); });
  m.def("driver_selection", [] { return rt::driver_selection(); });
  m.def("driver_capabilities", [] {
    const rt::DriverCapabilities c = rt::driver_capabilities();
    py::dict d;
    d["graphs"] = c.graphs;
    d["host_functions"] = c.host_functions;
    d["timing_events"] = c.timing_events;
    d["host_accessible_memory"] = c.host_accessible_memory;
    d["native_handles"] = c.native_handles;
    d["virtual_memory"] = c.virtual_memory;
    d["ipc_memory"] = c.ipc_memory;
    return d;
  });
  m.def("launch_blocking", &rt::launch_blocking);
  m.def("set_device", &rt::set_device, py::arg("device"));
  m.def("get_device", &rt::get_device);
  m.def(
      "get_device_properties",
      [](std::optional<int> d) {
        return properties_to_dict(rt::get_device_properties(d.value_or(-1)));
      },
      py::arg("device") = py::none());
  m.def(
      "mem_get_info",
      [](std::optional<int> d) {
        const rt::MemoryInfo info = rt::mem_get_info(d.value_or(-1));
        return py::make_tuple(info.free, info.total);
      },
      py::arg("device") = py::none());
  m.def(
      "synchronize", [](std::optional<int> d) { rt::device_synchronize(d.value_or(-1)); },
      py::arg("device") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def(
      "memory_stats",
      [](std::optional<int> d) { return stats_to_dict(rt::memory_stats(d.value_or(-1))); },
      py::arg("device") = py::none());
  m.def(
      "empty_cache", [](std::optional<int> d) { rt::empty_cache(d.value_or(-1)); },
      py::arg("device") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def(
      "reset_accumulated_memory_stats",
      [](std::optional<int> d) { rt::reset_accumulated_memory_stats(d.value_or(-1)); },
      py::arg("device") = py::none());
  m.def(
      "reset_peak_memory_stats",
      [](std::optional<int> d) { rt::reset_peak_memory_stats(d.value_or(-1)); },
      py::arg("device") = py::none());

  py::module_ r = m.def_submodule("_rt", "A small, checked view of the accel runtime");
  py::class_<PyStream>(r, "Stream")
      .def(py::init<std::optional<int>, int>(), py::arg("device") = py::none(),
           py::arg("priority") = 0)
      .def_property_readonly("device", &PyStream::device)
      .def_property_readonly("id", &PyStream::id)
      .def_property_readonly("priority", &PyStream::priority)
      .def("query", &PyStream::query)
      .def("synchronize", &PyStream::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("__repr__", &PyStream::repr);
  r.def(
      "default_stream",
      [](std::optional<int> d) {
        return std::make_unique<PyStream>(rt::default_stream(d.value_or(-1)));
      },
      py::arg("device") = py::none());
  r.def("priority_range", [] { return rt::stream_priority_range(); });

  py::class_<PyEvent>(r, "Event")
      .def(py::init<std::optional<int>, bool>(), py::arg("device") = py::none(),
           py::arg("enable_timing") = false)
      .def_property_readonly("device", &PyEvent::device)
      .def("record", &PyEvent::record, py::arg("stream") = nullptr)
      .def("wait", &PyEvent::wait, py::arg("stream") = nullptr)
      .def("query", &PyEvent::query)
      .def("synchronize", &PyEvent::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("elapsed_time", &PyEvent::elapsed_time, py::arg("end"));

  py::class_<DeviceBuffer>(r, "DeviceBuffer")
      .def(py::init<int64_t, const PyStream*, std::optional<int>>(), py::arg("nbytes"),
           py::arg("stream") = nullptr, py::arg("device") = py::none())
      .def_property_readonly("nbytes", &DeviceBuffer::nbytes)
      .def_property_readonly("device", &DeviceBuffer::device)
      .def_property_readonly("address", &DeviceBuffer::address)
      .def_property_readonly("freed", &DeviceBuffer::freed)
      .def("free", &DeviceBuffer::free)
      .def("copy_from_host", &DeviceBuffer::copy_from_host, py::arg("src"),
           py::arg("stream") = nullptr, py::arg("non_blocking") = false)
      .def("copy_to_host", &DeviceBuffer::copy_to_host, py::arg("dst"),
           py::arg("stream") = nullptr);
  r.def("axpy", &axpy, py::arg("alpha"), py::arg("x"), py::arg("y"), py::arg("stream") = nullptr,
        "y += alpha * x over float32 buffers, enqueued on the stream (current stream if None)");
}
