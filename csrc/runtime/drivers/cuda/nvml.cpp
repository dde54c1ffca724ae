#include "runtime/drivers/cuda/nvml.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "runtime/error.h"

namespace accel::rt::cuda {
namespace {
constexpr int kSuccess = 0;
constexpr int kNotSupported = 3;
constexpr int kInsufficientSize = 7;
constexpr int kNoPermission = 4;

template <class F>
bool find(void* library, const char* symbol, F& out) {
  out = reinterpret_cast<F>(::dlsym(library, symbol));
  return out != nullptr;
}
}  // namespace

bool NvmlApi::open(std::string& why) {
  library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* e = ::dlerror();
    why = std::string("NVML (libnvidia-ml.so.1, part of the NVIDIA driver) cannot be loaded: ") +
          (e != nullptr ? e : "not found");
    return false;
  }
  const bool all = find(library, "nvmlInit_v2", init) && find(library, "nvmlShutdown", shutdown) &&
                   find(library, "nvmlErrorString", error_string) &&
                   find(library, "nvmlDeviceGetCount_v2", count) &&
                   find(library, "nvmlDeviceGetHandleByPciBusId_v2", by_pci_bus_id) &&
                   find(library, "nvmlDeviceGetUtilizationRates", utilization) &&
                   find(library, "nvmlDeviceGetTemperature", temperature) &&
                   find(library, "nvmlDeviceGetPowerUsage", power) &&
                   find(library, "nvmlDeviceGetClockInfo", clock) &&
                   find(library, "nvmlDeviceGetMemoryInfo", memory) &&
                   find(library, "nvmlDeviceGetComputeRunningProcesses_v3", processes);
  if (!all) {
    why =
        "this NVML (libnvidia-ml.so.1) lacks entries the cuda driver uses; update the NVIDIA "
        "driver";
    close();
    return false;
  }
  return true;
}

void NvmlApi::close() {
  if (library != nullptr) ::dlclose(library);
  *this = NvmlApi{};
}

std::string NvmlApi::error(int status) const {
  const char* s = error_string != nullptr ? error_string(status) : nullptr;
  return std::string(s != nullptr ? s : "unknown NVML error") + " (" + std::to_string(status) + ")";
}

NvmlSensors::~NvmlSensors() {
  if (ready_) api_.shutdown();
  api_.close();
}

void NvmlSensors::fail(int status, const char* what, Sensor sensor) const {
  std::string message = std::string("cuda driver: ") + what + " failed: " + api_.error(status);
  if (status == kNotSupported || status == kNoPermission) {
    throw NotSupportedError(
        message + "; this GPU does not report its " + sensor_name(sensor) + " here", __FILE__,
        __LINE__);
  }
  throw DriverError(message, __FILE__, __LINE__);
}

NvmlApi::Device NvmlSensors::device_handle(int device) {
  // Under m_.
  if (!tried_) {
    tried_ = true;
    if (api_.open(why_)) {
      const int status = api_.init();
      ready_ = status == kSuccess;
      if (!ready_) {
        why_ = "nvmlInit failed: " + api_.error(status);
        api_.close();
      }
    }
  }
  if (!ready_) {
    throw NotSupportedError("cuda driver: device sensors come from NVML, and " + why_, __FILE__,
                            __LINE__);
  }
  if (handles_.size() <= static_cast<std::size_t>(device)) handles_.resize(device + 1, nullptr);
  if (handles_[device] == nullptr) {
    char bus[64] = {0};
    const cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof(bus), device);
    if (e != cudaSuccess) {
      throw DriverError(
          std::string("cuda driver: cudaDeviceGetPCIBusId failed: ") + cudaGetErrorName(e),
          __FILE__, __LINE__);
    }
    NvmlApi::Device h = nullptr;
    const int status = api_.by_pci_bus_id(bus, &h);
    if (status != kSuccess) {
      throw DriverError("cuda driver: NVML has no device at PCI bus id " + std::string(bus) + ": " +
                            api_.error(status),
                        __FILE__, __LINE__);
    }
    handles_[device] = h;
  }
  return handles_[device];
}

int64_t NvmlSensors::read(int device, Sensor sensor) {
  std::lock_guard<std::mutex> lock(m_);
  NvmlApi::Device h = device_handle(device);
  unsigned int value = 0;
  int status = kSuccess;
  switch (sensor) {
    case Sensor::Utilization:
    case Sensor::MemoryUtilization: {
      NvmlApi::Utilization u{};
      status = api_.utilization(h, &u);
      if (status != kSuccess) fail(status, "nvmlDeviceGetUtilizationRates", sensor);
      return sensor == Sensor::Utilization ? u.gpu : u.memory;
    }
    case Sensor::Temperature:
      status = api_.temperature(h, 0, &value);
      if (status != kSuccess) fail(status, "nvmlDeviceGetTemperature", sensor);
      return value;
    case Sensor::PowerDraw:
      status = api_.power(h, &value);
      if (status != kSuccess) fail(status, "nvmlDeviceGetPowerUsage", sensor);
      return value;
    case Sensor::ClockRate:
      status = api_.clock(h, 1, &value);
      if (status != kSuccess) fail(status, "nvmlDeviceGetClockInfo", sensor);
      return value;
    case Sensor::MemoryUsed: {
      NvmlApi::Memory mem{};
      status = api_.memory(h, &mem);
      if (status != kSuccess) fail(status, "nvmlDeviceGetMemoryInfo", sensor);
      return static_cast<int64_t>(mem.used);
    }
  }
  throw InvalidValueError("cuda driver: unknown sensor", __FILE__, __LINE__);
}

std::vector<DeviceProcess> NvmlSensors::processes(int device) {
  std::lock_guard<std::mutex> lock(m_);
  NvmlApi::Device h = device_handle(device);
  std::vector<NvmlApi::Process> found(16);
  for (int attempt = 0;; ++attempt) {
    unsigned int count = static_cast<unsigned int>(found.size());
    const int status = api_.processes(h, &count, found.data());
    if (status == kInsufficientSize && attempt < 4) {
      found.resize(count + 8);  // processes may start meanwhile
      continue;
    }
    if (status != kSuccess)
      fail(status, "nvmlDeviceGetComputeRunningProcesses", Sensor::MemoryUsed);
    std::vector<DeviceProcess> out;
    for (unsigned int i = 0; i < count; ++i) {
      const unsigned long long used = found[i].used_memory;
      out.push_back({static_cast<int64_t>(found[i].pid), used == ~0ULL ? 0 : used});
    }
    return out;
  }
}

}  // namespace accel::rt::cuda
