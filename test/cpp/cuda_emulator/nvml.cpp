// NVML emulated for the cuda driver on the emulated CUDA runtime: libnvidia-ml.so.1 in the
// emulated driver's directory, which the driver finds through its run path (the entries
// csrc/runtime/drivers/cuda/nvml.cpp opens, with NVML's C ABI as nvml.h declares it).
//
// Devices are the emulator's (its count and memory asked of the emulated driver, which exports
// them), found by the PCI bus ids its cudaDeviceGetPCIBusId gives. Readings differ per device so
// that a test sees which device was read: utilization 10 and 5 percent per device number plus one
// (GPU, memory), temperature 40 C plus the number, power 100 W plus 1 W per number, SM clock 1755
// MHz plus the number. Memory used is the emulator's own count of the device's memory in use, and
// the process list holds this process with that memory. Settings:
//   CUDA_EMULATOR_NVML=0                   nvmlInit fails (no NVIDIA driver loaded)
//   CUDA_EMULATOR_NVML_UNSUPPORTED=a,b     sensors (utilization, temperature, power, clock,
//                                          memory, processes) that report NOT_SUPPORTED
//   CUDA_EMULATOR_NVML_PROCESSES=N         N more processes on each device (1 MiB each; the
//                                          first with its memory not available)
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/drivers/cuda/nvml.h"

namespace {

using accel::rt::cuda::NvmlApi;

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kDriverNotLoaded = 9;
constexpr int kMaxDevices = 64;

std::atomic<int> g_initialized{0};
int g_devices[kMaxDevices];  // a device handle points at its number

unsigned long long env_number(const char* name, unsigned long long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

bool unsupported(const char* sensor) {
  const char* list = std::getenv("CUDA_EMULATOR_NVML_UNSUPPORTED");
  if (list == nullptr) return false;
  const std::string s = std::string(",") + list + ",";
  return s.find(std::string(",") + sensor + ",") != std::string::npos;
}

// The device's number, or -1 for a handle this library did not give.
int number(NvmlApi::Device d) {
  const auto* p = static_cast<const int*>(d);
  return p >= g_devices && p < g_devices + kMaxDevices ? *p : -1;
}

// The emulated CUDA runtime's devices, as the emulated cuda driver beside this library exports
// them (loaded already: it is what opened this library); nothing where it cannot be found.
struct Emulator {
  int (*device_count)() = nullptr;
  std::size_t (*device_memory)() = nullptr;
  std::size_t (*memory_used)(int device) = nullptr;
};

const Emulator& emulator() {
  static const Emulator e = [] {
    Emulator found;
    Dl_info self{};
    if (::dladdr(reinterpret_cast<void*>(&emulator), &self) == 0) return found;
    std::string path = self.dli_fname;
    path = path.substr(0, path.rfind('/') + 1) + "libaccel_driver_cuda.so";
    void* driver = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) return found;
    found.device_count = reinterpret_cast<int (*)()>(::dlsym(driver, "cuda_emulator_device_count"));
    found.device_memory =
        reinterpret_cast<std::size_t (*)()>(::dlsym(driver, "cuda_emulator_device_memory"));
    found.memory_used =
        reinterpret_cast<std::size_t (*)(int)>(::dlsym(driver, "cuda_emulator_memory_used"));
    return found;
  }();
  return e;
}

std::size_t memory_used(int device) {
  return emulator().memory_used != nullptr ? emulator().memory_used(device) : 0;
}

int device_count() {
  const int count = emulator().device_count != nullptr ? emulator().device_count() : 0;
  return count < 0 ? 0 : (count > kMaxDevices ? kMaxDevices : count);
}

// The checks every device query starts with: 0 and the device's number in *n, or the error.
int query(NvmlApi::Device d, const void* out, const char* sensor, int* n) {
  if (g_initialized.load() == 0) return kUninitialized;
  *n = number(d);
  if (*n < 0 || out == nullptr) return kInvalidArgument;
  return unsupported(sensor) ? kNotSupported : kSuccess;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const char* on = std::getenv("CUDA_EMULATOR_NVML");
  if (on != nullptr && std::strcmp(on, "0") == 0) return kDriverNotLoaded;
  for (int i = 0; i < kMaxDevices; ++i) g_devices[i] = i;
  g_initialized.fetch_add(1);
  return kSuccess;
}

int nvmlShutdown() {
  int n = g_initialized.load();
  do {
    if (n == 0) return kUninitialized;
  } while (!g_initialized.compare_exchange_weak(n, n - 1));
  return kSuccess;
}

const char* nvmlErrorString(int status) {
  switch (status) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kNotSupported: return "Not Supported";
    case kNotFound: return "Not Found";
    case kInsufficientSize: return "Insufficient Size";
    case kDriverNotLoaded: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_initialized.load() == 0) return kUninitialized;
  if (count == nullptr) return kInvalidArgument;
  *count = static_cast<unsigned int>(device_count());
  return kSuccess;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus, NvmlApi::Device* device) {
  if (g_initialized.load() == 0) return kUninitialized;
  if (bus == nullptr || device == nullptr) return kInvalidArgument;
  unsigned domain = 0, number = 0, slot = 0, function = 0;
  if (std::sscanf(bus, "%x:%x:%x.%x", &domain, &number, &slot, &function) != 4) {
    return kInvalidArgument;
  }
  const int index = static_cast<int>(number) - 0x10;  // the emulator's numbering
  if (domain != 0 || slot != 0 || function != 0 || index < 0 || index >= device_count()) {
    return kNotFound;
  }
  *device = &g_devices[index];
  return kSuccess;
}

int nvmlDeviceGetUtilizationRates(NvmlApi::Device d, NvmlApi::Utilization* u) {
  int n = 0;
  if (const int e = query(d, u, "utilization", &n); e != kSuccess) return e;
  u->gpu = 10u * static_cast<unsigned>(n + 1);
  u->memory = 5u * static_cast<unsigned>(n + 1);
  return kSuccess;
}

int nvmlDeviceGetTemperature(NvmlApi::Device d, int sensor, unsigned int* celsius) {
  int n = 0;
  if (const int e = query(d, celsius, "temperature", &n); e != kSuccess) return e;
  if (sensor != 0) return kInvalidArgument;  // NVML_TEMPERATURE_GPU
  *celsius = 40u + static_cast<unsigned>(n);
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(NvmlApi::Device d, unsigned int* milliwatts) {
  int n = 0;
  if (const int e = query(d, milliwatts, "power", &n); e != kSuccess) return e;
  *milliwatts = 100000u + 1000u * static_cast<unsigned>(n);
  return kSuccess;
}

int nvmlDeviceGetClockInfo(NvmlApi::Device d, int type, unsigned int* mhz) {
  int n = 0;
  if (const int e = query(d, mhz, "clock", &n); e != kSuccess) return e;
  if (type != 1) return kInvalidArgument;  // NVML_CLOCK_SM
  *mhz = 1755u + static_cast<unsigned>(n);
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(NvmlApi::Device d, NvmlApi::Memory* memory) {
  int n = 0;
  if (const int e = query(d, memory, "memory", &n); e != kSuccess) return e;
  memory->total = emulator().device_memory != nullptr ? emulator().device_memory() : 0;
  memory->used = memory_used(n);
  memory->free = memory->total - memory->used;
  return kSuccess;
}

int nvmlDeviceGetComputeRunningProcesses_v3(NvmlApi::Device d, unsigned int* count,
                                            NvmlApi::Process* processes) {
  int n = 0;
  if (const int e = query(d, count, "processes", &n); e != kSuccess) return e;
  const std::size_t used = memory_used(n);
  const unsigned others = static_cast<unsigned>(env_number("CUDA_EMULATOR_NVML_PROCESSES", 0));
  const unsigned total = (used > 0 ? 1u : 0u) + others;
  if (*count < total || (total > 0 && processes == nullptr)) {
    *count = total;
    return kInsufficientSize;
  }
  unsigned k = 0;
  if (used > 0) processes[k++] = {static_cast<unsigned>(::getpid()), used, ~0u, ~0u};
  for (unsigned i = 0; i < others; ++i) {
    processes[k++] = {100000u + i, i == 0 ? ~0ULL : 1ULL << 20, ~0u, ~0u};
  }
  *count = total;
  return kSuccess;
}

}  // extern "C"
