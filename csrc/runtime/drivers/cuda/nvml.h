// NVML for the cuda driver: device sensors (nvidia-smi's utilization, temperature, power, clock,
// memory) and the processes using a device. libnvidia-ml.so.1 comes with the NVIDIA driver, not
// the toolkit, so it is opened at run time, and the few entries used are declared here from
// NVML's public C ABI (the toolkit ships no nvml.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/types.h"

namespace accel::rt::cuda {

struct NvmlApi {
  struct Utilization {
    unsigned int gpu;     // percent
    unsigned int memory;  // percent
  };
  struct Memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  struct Process {  // nvmlProcessInfo_t
    unsigned int pid;
    unsigned long long used_memory;  // ~0ULL: not available
    unsigned int gpu_instance;
    unsigned int compute_instance;
  };
  using Device = void*;

  void* library = nullptr;
  int (*init)() = nullptr;      // nvmlInit_v2
  int (*shutdown)() = nullptr;  // nvmlShutdown
  const char* (*error_string)(int) = nullptr;
  int (*count)(unsigned int*) = nullptr;                        // nvmlDeviceGetCount_v2
  int (*by_pci_bus_id)(const char*, Device*) = nullptr;         // ..._v2
  int (*utilization)(Device, Utilization*) = nullptr;           // nvmlDeviceGetUtilizationRates
  int (*temperature)(Device, int, unsigned int*) = nullptr;     // sensor 0: the GPU die
  int (*power)(Device, unsigned int*) = nullptr;                // nvmlDeviceGetPowerUsage, mW
  int (*clock)(Device, int, unsigned int*) = nullptr;           // clock 1: SM, MHz
  int (*memory)(Device, Memory*) = nullptr;                     // nvmlDeviceGetMemoryInfo
  int (*processes)(Device, unsigned int*, Process*) = nullptr;  // ComputeRunningProcesses_v3

  // Opens the library and finds the entries; false with `why` when it cannot.
  bool open(std::string& why);
  void close();
  std::string error(int status) const;
};

// The driver's NVML: initialized at first use (never shut down while the driver lives), each
// accel device matched to its NVML device by PCI bus id, which holds whatever
// CUDA_VISIBLE_DEVICES renumbered.
class NvmlSensors {
 public:
  ~NvmlSensors();
  // Throws NotSupportedError without NVML or for a sensor the device lacks, DriverError when
  // NVML fails otherwise.
  int64_t read(int device, Sensor sensor);
  std::vector<DeviceProcess> processes(int device);

 private:
  NvmlApi::Device device_handle(int device);
  [[noreturn]] void fail(int status, const char* what, Sensor sensor) const;

  std::mutex m_;
  bool tried_ = false;
  bool ready_ = false;
  std::string why_;
  NvmlApi api_;
  std::vector<NvmlApi::Device> handles_;
};

}  // namespace accel::rt::cuda
