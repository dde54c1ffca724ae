#include "aten/executor.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include "aten/cuda/bridge.h"
#include "device/common.h"

namespace accel::aten {
namespace {

std::string this_library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&this_library_dir), &info) == 0 ||
      info.dli_fname == nullptr) {
    return ".";
  }
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

struct Choice {
  Executor executor = Executor::None;
  std::string why;  // no executor: why
  accel_cuda_enter_fn enter = nullptr;
  accel_cuda_exit_fn exit = nullptr;
};

// The cuda executor: libaccel_aten_cuda.so next to this library.
void load_cuda_bridge(Choice& c) {
  const std::string path = this_library_dir() + "/libaccel_aten_cuda.so";
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (h == nullptr) {
    const char* e = ::dlerror();
    c.why = "dlopen(" + path + ") failed: " + (e != nullptr ? e : "unknown error") +
            " (a build without the CUDA toolkit or without a CUDA build of torch has no bridge)";
    return;
  }
  const auto version =
      reinterpret_cast<accel_cuda_bridge_version_fn>(::dlsym(h, "accel_cuda_bridge_version"));
  c.enter = reinterpret_cast<accel_cuda_enter_fn>(::dlsym(h, "accel_cuda_enter"));
  c.exit = reinterpret_cast<accel_cuda_exit_fn>(::dlsym(h, "accel_cuda_exit"));
  if (version == nullptr || c.enter == nullptr || c.exit == nullptr ||
      version() != ACCEL_CUDA_BRIDGE_VERSION) {
    c.why = path + " is not the bridge of this build";
    return;
  }
  c.executor = Executor::Cuda;
}

const Choice& choice() {
  static const Choice c = [] {
    Choice c;
    if (host_accessible()) {
      c.executor = Executor::Host;
      return c;
    }
    const std::string driver = device::call([] { return std::string(rt::driver_name()); });
    if (driver == "cuda") {
      load_cuda_bridge(c);
    } else {
      c.why = "the " + driver + " driver has no executor for ATen kernels yet";
    }
    return c;
  }();
  return c;
}

}  // namespace

Executor executor() {
  return choice().executor;
}

const std::string& executor_unavailable_reason() {
  return choice().why;
}

c10::Device kernel_device(c10::DeviceIndex index) {
  if (executor() != Executor::Cuda) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, index < 0 ? device::current_device() : index);
}

KernelScope::KernelScope(c10::DeviceIndex device) {
  const Choice& c = choice();
  if (c.executor != Executor::Cuda) return;
  void* stream = device::call([&] { return rt::stream_native_handle(rt::current_stream(device)); });
  char error[512] = {0};
  state_ = c.enter(device, stream, error, sizeof(error));
  TORCH_CHECK(state_ != nullptr, "accel: cannot make accel device ", static_cast<int>(device),
              "'s stream current for CUDA kernels: ", error);
}

KernelScope::~KernelScope() {
  if (state_ != nullptr) choice().exit(state_);
}

}  // namespace accel::aten
