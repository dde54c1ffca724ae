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
  accel_cuda_current_stream_fn current_stream = nullptr;
  accel_cuda_wait_fn wait = nullptr;
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
  c.current_stream =
      reinterpret_cast<accel_cuda_current_stream_fn>(::dlsym(h, "accel_cuda_current_stream"));
  c.wait = reinterpret_cast<accel_cuda_wait_fn>(::dlsym(h, "accel_cuda_wait"));
  if (version == nullptr || c.enter == nullptr || c.exit == nullptr ||
      c.current_stream == nullptr || c.wait == nullptr || version() != ACCEL_CUDA_BRIDGE_VERSION) {
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

namespace {

void* accel_stream_handle(c10::DeviceIndex device) {
  return device::call([&] { return rt::stream_native_handle(rt::current_stream(device)); });
}

// `accel_waits`: the accel stream waits for PyTorch's current CUDA stream, else the reverse.
void order_with_torch_cuda(c10::DeviceIndex device, bool accel_waits) {
  const Choice& c = choice();
  TORCH_CHECK(c.executor == Executor::Cuda, "accel: not on the cuda driver");
  char error[512] = {0};
  void* torch_stream = nullptr;
  TORCH_CHECK(c.current_stream(device, &torch_stream, error, sizeof(error)) == 0,
              "accel: PyTorch's current CUDA stream of device ", static_cast<int>(device), ": ",
              error);
  void* accel = accel_stream_handle(device);
  const int status = accel_waits ? c.wait(device, accel, torch_stream, error, sizeof(error))
                                 : c.wait(device, torch_stream, accel, error, sizeof(error));
  TORCH_CHECK(status == 0, "accel: cannot order accel device ", static_cast<int>(device),
              "'s stream with PyTorch's CUDA stream: ", error);
}

}  // namespace

void accel_stream_waits_for_torch_cuda(c10::DeviceIndex device) {
  order_with_torch_cuda(device, true);
}

void torch_cuda_waits_for_accel_stream(c10::DeviceIndex device) {
  order_with_torch_cuda(device, false);
}

KernelScope::KernelScope(c10::DeviceIndex device) {
  const Choice& c = choice();
  if (c.executor != Executor::Cuda) return;
  char error[512] = {0};
  state_ = c.enter(device, accel_stream_handle(device), error, sizeof(error));
  TORCH_CHECK(state_ != nullptr, "accel: cannot make accel device ", static_cast<int>(device),
              "'s stream current for CUDA kernels: ", error);
}

KernelScope::~KernelScope() {
  if (state_ != nullptr) choice().exit(state_);
}

}  // namespace accel::aten
