// Bindings of the PyTorch integration (torch.accel builds on these).
#include <ATen/Context.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "aten/executor.h"
#include "aten/fallback.h"
#include "aten/fused_linear.h"
#include "aten/host_task.h"
#include "aten/meta_cache.h"
#include "aten/underlying.h"
#include "device/allocator.h"
#include "device/common.h"
#include "device/generator.h"
#include "python/bindings.h"

namespace py = pybind11;
namespace rt = accel::rt;

namespace accel::python {
namespace {

PyObject* g_capture_error = nullptr;

THPEvent* checked_event(py::handle obj) {
  if (!THPEvent_Check(obj.ptr())) throw py::type_error("expected a torch.Event");
  auto* e = reinterpret_cast<THPEvent*>(obj.ptr());
  if (e->event.device_type() != device::kAccel) {
    throw py::value_error("expected an accel event, got one of another device");
  }
  return e;
}

// torch_accel.CaptureError raised from inside an operator: torch's own bindings translate
// torch::PyTorchError to its python_type(), where a c10::Error would become a plain RuntimeError.
struct CaptureErrorInOp final : torch::PyTorchError {
  using PyTorchError::PyTorchError;
  PyObject* python_type() override { return g_capture_error; }
};

[[noreturn]] void throw_capture_error(const std::string& message) {
  throw CaptureErrorInOp(message);
}

// Inside the handler of a dropped meta computation (aten::set_dropped_error_handler): a Python
// meta function's error, still set in the interpreter, is fetched into its python_error (which
// releases it when the handler ends). Any other exception leaves the interpreter alone.
void take_dropped_python_error() noexcept {
  try {
    throw;
  } catch (python_error& e) {
    e.persist();
  } catch (...) {  // NOLINT(bugprone-empty-catch): not an error of Python's
  }
}

}  // namespace

void init_torch_bindings(py::module_& m, PyObject* capture_error) {
  g_capture_error = capture_error;
  device::set_capture_error_thrower(&throw_capture_error);
  aten::set_dropped_error_handler(&take_dropped_python_error);
  // The same errors raised inside this module's own functions.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (torch::PyTorchError& e) {
      PyErr_SetString(e.python_type(), e.what());
    }
  });

  m.def(
      "_init",
      [] {
        // PyTorch marks accel "in a bad fork" in children forked after this point.
        torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
        device::call([] { rt::init(); });
        at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
      },
      "Starts the runtime and ATen's accel state (torch.accel._lazy_init calls this).");
  m.def("_is_in_bad_fork",
        [] { return rt::in_bad_fork() || torch::utils::is_device_in_bad_fork(at::kPrivateUse1); });
  m.def(
      "_get_default_generator",
      [](int device) {
        const at::Generator& gen = device::default_generator(static_cast<c10::DeviceIndex>(device));
        return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
      },
      py::arg("device"));
  m.def(
      "_exchange_device",
      [](int device) {
        if (device < 0) return -1;
        return device::call([&] { return rt::exchange_device(device); });
      },
      py::arg("device"));

  // torch.accel.utilization, temperature, ... (the driver's sensors) and list_gpu_processes.
  m.def(
      "_device_sensor",
      [](const std::string& name, int device) {
        static const std::pair<const char*, rt::Sensor> kSensors[] = {
            {"utilization", rt::Sensor::Utilization},
            {"memory_utilization", rt::Sensor::MemoryUtilization},
            {"temperature", rt::Sensor::Temperature},
            {"power_draw", rt::Sensor::PowerDraw},
            {"clock_rate", rt::Sensor::ClockRate},
            {"memory_used", rt::Sensor::MemoryUsed}};
        for (const auto& [key, sensor] : kSensors) {
          if (name == key) {
            return device::call([&] { return rt::device_sensor(sensor, device); });
          }
        }
        throw py::value_error("unknown sensor " + name);
      },
      py::arg("sensor"), py::arg("device"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "_device_processes",
      [](int device) {
        std::vector<std::pair<int64_t, uint64_t>> out;
        for (const rt::DeviceProcess& p :
             device::call([&] { return rt::device_processes(device); })) {
          out.emplace_back(p.pid, p.memory);
        }
        return out;
      },
      py::arg("device"), py::call_guard<py::gil_scoped_release>());
  // torch.accel.ExternalStream: (stream_id, device_index, device_type) of the accel stream for a
  // native handle (another library's cudaStream_t on the cuda driver).
  m.def(
      "_stream_from_external",
      [](uintptr_t handle, int device) {
        const c10::Stream s = device::to_c10(device::call(
            [&] { return rt::stream_from_native(reinterpret_cast<void*>(handle), device); }));
        return py::make_tuple(s.id(), s.device_index(), static_cast<int>(s.device_type()));
      },
      py::arg("handle"), py::arg("device"));

  // torch.accel.Stream.priority (torch.Stream has none): the priority the stream was made with,
  // within Stream.priority_range().
  m.def(
      "_stream_priority",
      [](int64_t stream_id, int device) {
        const c10::Stream s(c10::Stream::UNSAFE,
                            c10::Device(device::kAccel, static_cast<c10::DeviceIndex>(device)),
                            static_cast<c10::StreamId>(stream_id));
        return device::call([&] { return rt::stream_priority(device::to_rt(s)); });
      },
      py::arg("stream_id"), py::arg("device"));

  // torch.Event.elapsed_time accepts only exact torch.Event objects; torch.accel.Event (a
  // subclass) measures through the runtime with the events' ids (checked runtime handles).
  m.def(
      "_event_elapsed_time",
      [](uint64_t start, uint64_t end) {
        if (start == 0 || end == 0) {
          throw py::value_error("elapsed_time: both events must be recorded first");
        }
        return device::call([&] {
          return rt::event_elapsed_time(rt::Event::from_bits(start), rt::Event::from_bits(end));
        });
      },
      py::arg("start"), py::arg("end"));

  // torch.accel.Event(interprocess=True) and Event.from_ipc_handle: the torch.Event `event` (just
  // made, never recorded) takes an interprocess runtime event, new or opened from `handle`.
  m.def(
      "_event_adopt_interprocess",
      [](py::handle event, int device, std::optional<py::bytes> handle) {
        THPEvent* self = checked_event(event);
        std::optional<rt::IpcEventHandle> h;
        if (handle.has_value()) {
          const std::string bytes = *handle;
          if (bytes.size() != sizeof(rt::IpcEventHandle::bytes)) {
            throw py::value_error("from_ipc_handle: an accel event handle has " +
                                  std::to_string(sizeof(rt::IpcEventHandle::bytes)) +
                                  " bytes, got " + std::to_string(bytes.size()));
          }
          h.emplace();
          std::memcpy(h->bytes, bytes.data(), bytes.size());
        }
        const rt::Event e = device::call([&] {
          return h ? rt::event_open_ipc_handle(device, *h) : rt::event_create_interprocess(device);
        });
        try {
          device::adopt_event(self->event, e, device::to_c10(rt::current_stream(device)));
        } catch (...) {
          rt::event_destroy(e);
          throw;
        }
      },
      py::arg("event"), py::arg("device"), py::arg("handle") = py::none());
  m.def(
      "_event_ipc_handle",
      [](py::handle event) {
        THPEvent* self = checked_event(event);
        void* id = self->event.eventId();
        if (id == nullptr) {
          throw py::value_error(
              "ipc_handle: the event is not an interprocess event; create it with "
              "torch.accel.Event(interprocess=True)");
        }
        const rt::IpcEventHandle h = device::call([&] {
          return rt::event_ipc_handle(rt::Event::from_bits(reinterpret_cast<uintptr_t>(id)));
        });
        return py::bytes(reinterpret_cast<const char*>(h.bytes), sizeof(h.bytes));
      },
      py::arg("event"));

  // torch.accel._sleep (torch.cuda._sleep): occupies the current stream for about `cycles`
  // nanoseconds (a GPU's cycle is about one), so that tests can hold a stream busy.
  m.def(
      "_sleep",
      [](int64_t cycles) {
        if (cycles < 0) throw py::value_error("_sleep: cycles must be non-negative");
        device::call([&] {
          const rt::Stream s = rt::current_stream(device::current_device());
          rt::launch_host_func(
              s, [cycles] { std::this_thread::sleep_for(std::chrono::nanoseconds(cycles)); },
              "sleep");
        });
      },
      py::arg("cycles"));
  m.def("fallback_stats", [] {
    py::dict d;
    for (const auto& [name, count] : aten::fallback_stats()) d[py::str(name)] = count;
    return d;
  });
  m.def("reset_fallback_stats", &aten::reset_fallback_stats);
  m.def("executor", [] {
    const aten::Executor e = aten::executor();
    const char* name = e == aten::Executor::Host   ? "host"
                       : e == aten::Executor::Cuda ? "cuda"
                                                   : "none";
    return py::make_tuple(name, aten::executor_unavailable_reason());
  });
  m.def("_get_fallback_mode",
        [] { return std::string(aten::fallback_mode_name(aten::fallback_mode())); });
  m.def(
      "_set_fallback_mode",
      [](const std::string& mode) {
        aten::FallbackMode parsed;
        if (!aten::parse_fallback_mode(mode, &parsed)) {
          throw py::value_error("fallback mode must be 'warn', 'silent' or 'error', not '" + mode +
                                "'");
        }
        aten::set_fallback_mode(parsed);
      },
      py::arg("mode"));
  // torch.accel.set_sync_debug_mode / get_sync_debug_mode (the Python side parses names).
  m.def("_get_sync_debug_mode", [] { return static_cast<int>(aten::sync_debug_mode()); });
  m.def(
      "_set_sync_debug_mode",
      [](int mode) {
        if (mode < 0 || mode > 2) {
          throw py::value_error("invalid value of debug_mode " + std::to_string(mode) +
                                ", expected one of 0 (default), 1 (warn), 2 (error)");
        }
        aten::set_sync_debug_mode(static_cast<aten::SyncDebugMode>(mode));
      },
      py::arg("mode"));
  m.def("_prefer_executor_kernels", &aten::prefer_executor_kernels, py::arg("namespace"),
        "Registers accel kernels for the namespace's operators that have a CPU or CUDA kernel "
        "and a CompositeExplicitAutograd one: each call runs the driver's executor kernel (CPU "
        "on the host driver, CUDA on cuda) on accel memory, or the composite where there is "
        "none; returns the operators registered.");
  // Benchmarks and tests compare the underlying tier with the copying CPU fallback.
  m.def("_set_force_fallback", &aten::set_force_fallback, py::arg("force"),
        "Sends underlying-tier operators through the CPU fallback (for comparisons).");
  m.def("_get_force_fallback", &aten::force_fallback);
  m.def(
      "_typed_calls",
      [] {
        const aten::TypedCalls& c = aten::typed_calls();
        return py::make_tuple(c.borrowed, c.boxed);
      },
      "The calling thread's calls of underlying operators' typed entries so far: (run "
      "asynchronously on borrowed arguments, sent to the boxed kernel).");
  // torch.multiprocessing of accel tensors (torch_accel/accel/ipc.py): what an exporting
  // process pickles, and the storage an importing process makes of it.
  m.def(
      "_ipc_export",
      [](uintptr_t ptr) {
        const rt::IpcExport e =
            device::call([&] { return rt::ipc_export(reinterpret_cast<void*>(ptr)); });
        return py::make_tuple(
            e.device,
            py::bytes(reinterpret_cast<const char*>(e.handle.bytes), sizeof(e.handle.bytes)),
            e.segment_size, e.offset, e.ref_pid, e.ref_fd, e.ref_inode, e.ref_slot);
      },
      py::arg("ptr"));
  m.def(
      "_ipc_import",
      [](int device, const py::bytes& handle, std::size_t segment_size, std::size_t offset,
         int64_t ref_pid, int ref_fd, uint64_t ref_inode, uint32_t ref_slot, std::size_t nbytes) {
        rt::IpcExport e{.device = device,
                        .segment_size = segment_size,
                        .offset = offset,
                        .ref_pid = ref_pid,
                        .ref_fd = ref_fd,
                        .ref_inode = ref_inode,
                        .ref_slot = ref_slot};
        const std::string h = handle;
        if (h.size() != sizeof(e.handle.bytes)) {
          throw py::value_error("an accel memory handle has " +
                                std::to_string(sizeof(e.handle.bytes)) + " bytes, not " +
                                std::to_string(h.size()));
        }
        std::memcpy(e.handle.bytes, h.data(), h.size());
        void* ptr = device::call([&] { return rt::ipc_import(e); });
        c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                             device::import_data_ptr(ptr, device), /*allocator=*/nullptr,
                             /*resizable=*/false);
        auto impl = c10::make_intrusive<c10::TensorImpl>(
            std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
            caffe2::TypeMeta::Make<uint8_t>());
        impl->set_sizes_contiguous({static_cast<int64_t>(nbytes)});
        return at::Tensor(std::move(impl));
      },
      py::arg("device"), py::arg("handle"), py::arg("segment_size"), py::arg("offset"),
      py::arg("ref_pid"), py::arg("ref_fd"), py::arg("ref_inode"), py::arg("ref_slot"),
      py::arg("nbytes"),
      "A uint8 tensor over the device memory another process exported (its storage releases "
      "the import when it dies).");
  m.def(
      "_ipc_collect",
      [](int device) { return device::call([&] { return rt::ipc_collect(device); }); },
      py::arg("device") = -2);
  m.def(
      "_ipc_pending",
      [](int device) { return device::call([&] { return rt::ipc_pending(device); }); },
      py::arg("device") = -1);
  // accel::linear_act's implementation (torch_accel.ops.linear_kernel, ACCEL_LINEAR_KERNEL).
  static constexpr const char* kLinearKernels[] = {"auto", "fused", "aten"};
  m.def("_get_linear_kernel",
        [] { return std::string(kLinearKernels[static_cast<int>(aten::linear_kernel())]); });
  m.def(
      "_set_linear_kernel",
      [](const std::string& kernel) {
        for (int i = 0; i < 3; ++i) {
          if (kernel == kLinearKernels[i]) {
            aten::set_linear_kernel(static_cast<aten::LinearKernel>(i));
            return;
          }
        }
        throw py::value_error("linear kernel must be 'auto', 'fused' or 'aten', not '" + kernel +
                              "'");
      },
      py::arg("kernel"));
}

}  // namespace accel::python
