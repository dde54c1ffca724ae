#include "aten/executor.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "aten/cuda/bridge.h"
#include "device/common.h"
#include "device/graph.h"
#include "device/graph_rng.h"

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
  accel_cuda_pool_begin_fn pool_begin = nullptr;
  accel_cuda_pool_end_fn pool_end = nullptr;
  accel_cuda_pool_release_fn pool_release = nullptr;
  accel_cuda_empty_cache_fn empty_cache = nullptr;
  accel_cuda_graph_rng_create_fn graph_rng_create = nullptr;
  accel_cuda_graph_rng_generator_fn graph_rng_generator = nullptr;
  accel_cuda_graph_rng_increment_fn graph_rng_increment = nullptr;
  accel_cuda_graph_rng_destroy_fn graph_rng_destroy = nullptr;
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
  c.pool_begin = reinterpret_cast<accel_cuda_pool_begin_fn>(::dlsym(h, "accel_cuda_pool_begin"));
  c.pool_end = reinterpret_cast<accel_cuda_pool_end_fn>(::dlsym(h, "accel_cuda_pool_end"));
  c.pool_release =
      reinterpret_cast<accel_cuda_pool_release_fn>(::dlsym(h, "accel_cuda_pool_release"));
  c.empty_cache = reinterpret_cast<accel_cuda_empty_cache_fn>(::dlsym(h, "accel_cuda_empty_cache"));
  c.graph_rng_create =
      reinterpret_cast<accel_cuda_graph_rng_create_fn>(::dlsym(h, "accel_cuda_graph_rng_create"));
  c.graph_rng_generator = reinterpret_cast<accel_cuda_graph_rng_generator_fn>(
      ::dlsym(h, "accel_cuda_graph_rng_generator"));
  c.graph_rng_increment = reinterpret_cast<accel_cuda_graph_rng_increment_fn>(
      ::dlsym(h, "accel_cuda_graph_rng_increment"));
  c.graph_rng_destroy =
      reinterpret_cast<accel_cuda_graph_rng_destroy_fn>(::dlsym(h, "accel_cuda_graph_rng_destroy"));
  if (version == nullptr || c.enter == nullptr || c.exit == nullptr ||
      c.current_stream == nullptr || c.wait == nullptr || c.pool_begin == nullptr ||
      c.pool_end == nullptr || c.pool_release == nullptr || c.empty_cache == nullptr ||
      c.graph_rng_create == nullptr || c.graph_rng_generator == nullptr ||
      c.graph_rng_increment == nullptr || c.graph_rng_destroy == nullptr ||
      version() != ACCEL_CUDA_BRIDGE_VERSION) {
    c.why = path + " is not the bridge of this build";
    return;
  }
  c.executor = Executor::Cuda;
  // Two caches share the GPU: PyTorch's CUDA allocator keeps the kernels' temporaries. When
  // accel's allocation fails, it gives its unused memory back and accel retries.
  const accel_cuda_empty_cache_fn empty_cache = c.empty_cache;
  device::call([&] {
    rt::attach_memory_pressure_hook([empty_cache](int device, std::size_t) {
      char error[256] = {0};
      return empty_cache(device, error, sizeof(error)) == 1;
    });
  });
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
      // The driver found GPUs; ATen's CUDA kernels also need torch's CUDA to find them (a CPU
      // build of torch, an older NVIDIA driver than torch's CUDA, an emulated GPU): else the
      // visible fallback, saying why, instead of an error from every operator.
      if (!at::detail::getCUDAHooks().hasCUDA()) {
        c.why =
            "torch's CUDA finds no GPU (torch.cuda.is_available() is False), so ATen's CUDA "
            "kernels cannot run on the cuda driver's memory";
        return c;
      }
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

namespace {

// A graph's CUDA generator for one accel generator (device/graph_rng.h), made by the bridge.
class BridgeGraphRng final : public device::CapturedCudaRng {
 public:
  explicit BridgeGraphRng(void* handle) : handle_(handle) {}
  ~BridgeGraphRng() override { choice().graph_rng_destroy(handle_); }
  BridgeGraphRng(const BridgeGraphRng&) = delete;
  BridgeGraphRng& operator=(const BridgeGraphRng&) = delete;

  at::Generator generator() const override {
    auto* impl = static_cast<c10::GeneratorImpl*>(choice().graph_rng_generator(handle_));
    return at::Generator(c10::intrusive_ptr<c10::GeneratorImpl>::reclaim_copy(impl));
  }
  uint64_t increment() const override { return choice().graph_rng_increment(handle_); }

 private:
  void* handle_;
};

}  // namespace

std::unique_ptr<device::CapturedCudaRng> make_captured_cuda_rng(c10::DeviceIndex device,
                                                                int64_t* seed_offset) {
  const Choice& c = choice();
  TORCH_CHECK(c.executor == Executor::Cuda, "accel: not on the cuda driver");
  char error[512] = {0};
  void* handle =
      c.graph_rng_create(device, reinterpret_cast<long long*>(seed_offset), error, sizeof(error));
  TORCH_CHECK(handle != nullptr,
              "accel: a CUDA generator for the graph's random operators: ", error);
  return std::make_unique<BridgeGraphRng>(handle);
}

void accel_stream_waits_for_torch_cuda(c10::DeviceIndex device) {
  order_with_torch_cuda(device, true);
}

void torch_cuda_waits_for_accel_stream(c10::DeviceIndex device) {
  order_with_torch_cuda(device, false);
}

namespace {

// Graph captures on cuda: PyTorch's CUDA allocations during the capture (kernels' temporaries)
// go to a private pool of its allocator, kept until the graph is reset or destroyed, as
// torch.cuda.graph keeps its own (device/graph.h CaptureHooks).
struct CapturePool {
  int device = 0;
  unsigned long long id[2] = {0, 0};
};
std::mutex g_pools_mutex;
std::unordered_map<uint64_t, CapturePool>& capture_pools() {
  static auto* pools = new std::unordered_map<uint64_t, CapturePool>;  // never destroyed
  return *pools;
}

void check_bridge(int status, const char* what, const char* error) {
  TORCH_CHECK(status == 0, "accel: ", what, ": ", error);
}

void pool_begin(rt::Graph graph, rt::Stream stream) {
  if (executor() != Executor::Cuda) return;
  CapturePool pool;
  pool.device = stream.device();
  char error[512] = {0};
  void* handle = device::call([&] { return rt::stream_native_handle(stream); });
  check_bridge(choice().pool_begin(pool.device, handle, pool.id, error, sizeof(error)),
               "routing CUDA allocations of the capture to a private pool", error);
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  capture_pools()[graph.bits()] = pool;
}

// The pool of `graph`'s capture (forgotten if `forget`), or nothing.
std::optional<CapturePool> capture_pool(rt::Graph graph, bool forget) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  auto it = capture_pools().find(graph.bits());
  if (it == capture_pools().end()) return std::nullopt;
  const CapturePool pool = it->second;
  if (forget) capture_pools().erase(it);
  return pool;
}

void pool_end(rt::Graph graph) {
  if (executor() != Executor::Cuda) return;
  const std::optional<CapturePool> pool = capture_pool(graph, false);
  if (!pool) return;
  char error[512] = {0};
  check_bridge(choice().pool_end(pool->device, pool->id, error, sizeof(error)),
               "ending the capture's CUDA pool", error);
}

void pool_release(rt::Graph graph) {
  if (executor() != Executor::Cuda) return;
  const std::optional<CapturePool> pool = capture_pool(graph, true);
  if (!pool) return;
  char error[512] = {0};
  (void)choice().pool_release(pool->device, pool->id, error, sizeof(error));  // best effort
}

[[maybe_unused]] const bool g_hooks_set = [] {
  device::set_capture_hooks({&pool_begin, &pool_end, &pool_release});
  return true;
}();

}  // namespace

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
