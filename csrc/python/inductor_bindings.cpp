// Launching Inductor's generated C++ kernels on accel streams (torch_accel/_inductor).
//
// Inductor compiles each kernel for accel with a trampoline taking its arguments as an array of
// 64-bit words (pointers, integers, doubles). A launcher made here for that trampoline packs
// the call's arguments on the calling thread (data pointers of accel tensors, no dereference)
// and enqueues one task on the current stream of their device: the kernel runs in stream order
// with eager accel work, and a capturing stream records it into the graph.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "aoti/aoti.h"
#include "aten/underlying_task.h"
#include "device/common.h"
#include "python/bindings.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace rt = accel::rt;

namespace accel::python {
namespace {

using Trampoline = void (*)(const uint64_t*);

class KernelLauncher {
 public:
  KernelLauncher(uintptr_t trampoline, std::string kinds, std::string name)
      : fn_(reinterpret_cast<Trampoline>(trampoline)),
        kinds_(std::move(kinds)),
        name_(std::move(name)) {
    for (char k : kinds_) {
      if (k != 'p' && k != 'i' && k != 'f') {
        throw py::value_error("inductor launcher: argument kinds are 'p', 'i' or 'f', not '" +
                              std::string(1, k) + "'");
      }
    }
  }

  void operator()(const py::args& args) const {
    if (args.size() != kinds_.size()) {
      throw py::type_error(name_ + ": expected " + std::to_string(kinds_.size()) +
                           " arguments, got " + std::to_string(args.size()));
    }
    // The kernel is host code reading accel memory: only where that is host memory (a kernel
    // from the FX-graph cache reaches here without compiling, so the check is here too).
    static const bool host_memory =
        device::call([] { return rt::device_memory_host_accessible(); });
    if (!host_memory) {
      PyErr_SetString(PyExc_NotImplementedError,
                      (name_ +
                       ": kernels torch.compile generated for accel run on the host, and "
                       "the " +
                       std::string(rt::driver_name()) +
                       " driver's device memory is not host memory; run eagerly, or with "
                       "ACCEL_DRIVER=host")
                          .c_str());
      throw py::error_already_set();
    }
    std::vector<uint64_t> words(kinds_.size());
    c10::SmallVector<const void*, 8> buffers;  // a capture keeps their memory
    int device = -1;
    for (size_t i = 0; i < kinds_.size(); ++i) {
      const py::handle a = args[i];
      switch (kinds_[i]) {
        case 'p': {
          if (!THPVariable_Check(a.ptr())) {
            throw py::type_error(name_ + ": argument " + std::to_string(i) +
                                 " must be a tensor, not " +
                                 std::string(py::str(py::type::of(a).attr("__name__"))));
          }
          const at::Tensor& t = THPVariable_Unpack(a.ptr());
          if (t.device().type() != device::kAccel) {
            throw py::value_error(name_ + ": argument " + std::to_string(i) + " is on " +
                                  t.device().str() +
                                  "; kernels compiled for accel take accel tensors only");
          }
          if (device == -1) {
            device = t.device().index();
          } else if (device != t.device().index()) {
            throw py::value_error(name_ + ": tensors on accel:" + std::to_string(device) + " and " +
                                  t.device().str() + " in one kernel");
          }
          words[i] = reinterpret_cast<uintptr_t>(t.data_ptr());
          buffers.push_back(t.data_ptr());
          break;
        }
        case 'i': words[i] = static_cast<uint64_t>(a.cast<int64_t>()); break;
        case 'f': {
          const double d = a.cast<double>();
          std::memcpy(&words[i], &d, sizeof d);
          break;
        }
      }
    }
    device::call(
        [&] {
          const rt::Stream s = rt::current_stream(device);
          aten::keep_for_capture(device, buffers);
          rt::launch_host_func(s, rt::Task([fn = fn_, w = std::move(words)] { fn(w.data()); }),
                               name_.c_str());
        },
        name_.c_str());
  }

  const std::string& name() const { return name_; }

 private:
  Trampoline fn_;
  std::string kinds_;
  std::string name_;
};

}  // namespace

void init_inductor_bindings(py::module_& m) {
  py::class_<KernelLauncher>(m, "_InductorLauncher")
      .def(py::init<uintptr_t, std::string, std::string>(), py::arg("trampoline"), py::arg("kinds"),
           py::arg("name"))
      .def("__call__", &KernelLauncher::operator())
      .def_property_readonly("name", &KernelLauncher::name);
  // Before Inductor loads a C++ wrapper compiled for accel (csrc/aoti).
  m.def("_expose_aoti_symbols", &aoti::expose_symbols);
  // How many elements a call needs before its kernel on a stream worker uses intra-op threads
  // (torch_accel/_inductor applies the same rule to generated loops).
  m.def("_serial_numel", [] { return aten::serial_numel(); });
  // Before a Triton kernel launch of Inductor's wrapper (the cuda driver): while the current
  // stream of `device` captures, the graph keeps the memory of the accel tensors among `args`
  // (rt::capture_keep_memory); the other arguments are the kernel's scalars.
  m.def(
      "_capture_keep",
      [](int device, const py::args& args) {
        device::call(
            [&] {
              // Every launch calls this: outside captures no argument is looked at.
              if (!rt::device_is_capturing(device)) return;
              c10::SmallVector<const void*, 8> buffers;
              for (const py::handle a : args) {
                if (!THPVariable_Check(a.ptr())) continue;
                const at::Tensor& t = THPVariable_Unpack(a.ptr());
                if (t.defined() && t.device().type() == device::kAccel && t.has_storage()) {
                  buffers.push_back(t.storage().data());
                }
              }
              aten::keep_for_capture(device, buffers);
            },
            "_capture_keep");
      },
      py::arg("device"));
  // Swaps the memory of two accel storages of one size: every tensor on `a`'s storage (views,
  // autograd's saved copies) then reads `b`'s memory, and the reverse. backend="accel" moves
  // a captured graph's outputs that are still held to new memory before a replay rewrites them.
  m.def(
      "_swap_storage_memory",
      [](const py::handle& a, const py::handle& b) {
        c10::StorageImpl* sa = THPVariable_Unpack(a.ptr()).storage().unsafeGetStorageImpl();
        c10::StorageImpl* sb = THPVariable_Unpack(b.ptr()).storage().unsafeGetStorageImpl();
        TORCH_CHECK(sa->device() == sb->device() && sa->device().type() == device::kAccel,
                    "_swap_storage_memory: storages on one accel device expected, got ",
                    sa->device(), " and ", sb->device());
        TORCH_CHECK(sa->nbytes() == sb->nbytes(), "_swap_storage_memory: storages of ",
                    sa->nbytes(), " and ", sb->nbytes(), " bytes");
        if (sa == sb) return;
        at::DataPtr from_a = sa->set_data_ptr(c10::DataPtr(nullptr, sa->device()));
        sa->set_data_ptr_noswap(sb->set_data_ptr(std::move(from_a)));
      },
      py::arg("a"), py::arg("b"));
}

}  // namespace accel::python
