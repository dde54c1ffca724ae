// Running AOTInductor packages compiled for accel (torch._inductor.aoti_load_package, and
// torch::inductor::AOTIModelPackageLoader in C++): the model runner registered for the "accel"
// device key through PyTorch's runner registry (RegisterAOTIModelRunner).
//
// AOTInductor's model runtime (compiled into each package from PyTorch's headers) knows the
// devices cpu, cuda, xpu and mps only, so the model is created as a CPU model: its weights load
// as CPU tensors and the generated code takes their accel copies (aoti_torch_accel_constant),
// while its buffers, kernels and extern calls are accel's (cpp_wrapper.py). The runner makes
// the package's device the current one while the model runs, and gives libtorch_accel's symbols
// (accel's C shim, the launcher) global scope before the package's library loads.
#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>

#include <c10/core/DeviceGuard.h>

#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>

#include "aoti/aoti.h"
#include "device/common.h"

namespace rt = accel::rt;

namespace {

using torch::inductor::AOTIModelContainerRunner;

c10::DeviceIndex parse_device(const std::string& device_str) {
  // "accel", "accel:1" (also PyTorch's generic name of the backend, "privateuse1").
  static const std::regex re("(accel|privateuse1)(:([0-9]+))?");
  std::smatch m;
  TORCH_CHECK(std::regex_match(device_str, m, re), "AOTInductor: '", device_str,
              "' is not an accel device");
  return m[3].matched ? static_cast<c10::DeviceIndex>(std::stoi(m[3].str()))
                      : accel::device::current_device();
}

// The model's kernels are code in the package's library, run as stream tasks after run()
// returns: the library must outlive them. The runner waits for the work its runs left on each
// stream before the library unloads, and keeps it loaded for good once a graph captured a run
// (the graph may replay the kernels at any time).
class AccelModelRunner : public AOTIModelContainerRunner {
 public:
  AccelModelRunner(const std::string& model_so_path, size_t num_models, c10::DeviceIndex device,
                   const std::string& bin_dir, bool run_single_threaded)
      : AOTIModelContainerRunner(model_so_path, num_models, "cpu", bin_dir, run_single_threaded),
        device_(device) {}

  ~AccelModelRunner() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [stream, event] : last_runs_) {
      try {
        rt::event_synchronize(event);
        rt::event_destroy(event);
      } catch (const rt::Error&) {
        captured_ = true;  // a device error: keep the code for whatever still references it
      }
    }
    if (captured_) (void)model_so_.release();  // never unloaded
  }

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles,
                                   void* stream_handle) override {
    const c10::DeviceGuard guard(c10::Device(accel::device::kAccel, device_));
    std::vector<at::Tensor> outputs =
        AOTIModelContainerRunner::run_impl(input_handles, stream_handle);
    accel::device::call([&] {
      const rt::Stream s = rt::current_stream(device_);
      std::lock_guard<std::mutex> lock(mu_);
      if (rt::stream_capture_status(s) != rt::CaptureStatus::None) {
        captured_ = true;
        return;
      }
      auto [it, fresh] = last_runs_.try_emplace(s.bits(), rt::Event{});
      if (fresh) it->second = rt::event_create(device_);
      rt::event_record(it->second, s);
    });
    return outputs;
  }

 private:
  c10::DeviceIndex device_;
  std::mutex mu_;
  std::map<uint64_t, rt::Event> last_runs_;  // by stream: an event after its last run
  bool captured_ = false;
};

}  // namespace

namespace accel::aoti {

void expose_symbols() {  // Python loaded libtorch_accel with local scope
  Dl_info info{};
  TORCH_CHECK(
      dladdr(reinterpret_cast<void*>(&expose_symbols), &info) != 0 && info.dli_fname != nullptr,
      "torch_accel: cannot find libtorch_accel's path");
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  TORCH_CHECK(self != nullptr, "torch_accel: cannot give libtorch_accel global scope: ", dlerror());
  // The handle from RTLD_NOLOAD holds a reference; the library stays loaded anyway.
}

}  // namespace accel::aoti

namespace {

std::unique_ptr<AOTIModelContainerRunner> create_runner(const std::string& model_so_path,
                                                        size_t num_models,
                                                        const std::string& device_str,
                                                        const std::string& bin_dir,
                                                        const bool run_single_threaded) {
  accel::aoti::expose_symbols();
  return std::make_unique<AccelModelRunner>(model_so_path, num_models, parse_device(device_str),
                                            bin_dir, run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner register_accel_runner("accel", &create_runner);

}  // namespace
