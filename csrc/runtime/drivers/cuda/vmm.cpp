#include "runtime/drivers/cuda/vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "runtime/error.h"

namespace accel::rt::cuda {

struct Vmm::Entries {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
};

namespace {

template <class F>
bool entry(const char* symbol, F& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, CUDA_VERSION, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  out = reinterpret_cast<F>(fn);
  return true;
}

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUdeviceptr dptr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

bool Vmm::load(int device, std::string& why) {
  auto* e = new Entries;
  const bool all = entry("cuGetErrorName", e->get_error_name) &&
                   entry("cuDeviceGet", e->device_get) &&
                   entry("cuDeviceGetAttribute", e->device_attribute) &&
                   entry("cuMemGetAllocationGranularity", e->granularity) &&
                   entry("cuMemAddressReserve", e->reserve) &&
                   entry("cuMemAddressFree", e->address_free) && entry("cuMemCreate", e->create) &&
                   entry("cuMemRelease", e->release) && entry("cuMemMap", e->map) &&
                   entry("cuMemUnmap", e->unmap) && entry("cuMemSetAccess", e->set_access);
  if (!all) {
    delete e;
    why = "the CUDA driver lacks the cuMem* entries";
    return false;
  }
  CUdevice dev = 0;
  int supported = 0;
  if (e->device_get(&dev, device) != CUDA_SUCCESS ||
      e->device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                          dev) != CUDA_SUCCESS ||
      supported == 0) {
    delete e;
    why = "the GPU does not support virtual memory management";
    return false;
  }
  e_ = e;
  return true;
}

void Vmm::check(int result, const char* call) const {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  e_->get_error_name(static_cast<CUresult>(result), &name);
  const std::string what = std::string("cuda driver: ") + call +
                           " failed: " + (name != nullptr ? name : "an unknown CUresult");
  if (result == CUDA_ERROR_OUT_OF_MEMORY) throw OutOfMemoryError(what, __FILE__, __LINE__);
  throw DriverError(what, __FILE__, __LINE__);
}

std::size_t Vmm::granularity(int device) {
  const CUmemAllocationProp prop = device_memory(device);
  std::size_t g = 0;
  check(e_->granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  return g;
}

void* Vmm::reserve(std::size_t size) {
  CUdeviceptr p = 0;
  const CUresult r = e_->reserve(&p, size, 0, 0, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_VALUE) return nullptr;
  check(r, "cuMemAddressReserve");
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

void Vmm::release(void* ptr, std::size_t size) {
  check(e_->address_free(dptr(ptr), size), "cuMemAddressFree");
}

bool Vmm::map(int device, void* ptr, std::size_t size) {
  const CUmemAllocationProp prop = device_memory(device);
  const std::size_t page = granularity(device);
  auto* base = static_cast<char*>(ptr);
  std::vector<std::pair<char*, CUmemGenericAllocationHandle>> mapped;
  const auto undo = [&] {
    for (auto& [p, h] : mapped) {
      e_->unmap(dptr(p), page);
      e_->release(h);
    }
  };
  for (std::size_t off = 0; off < size; off += page) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = e_->create(&h, page, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      undo();
      return false;
    }
    if (r != CUDA_SUCCESS) undo();
    check(r, "cuMemCreate");
    const CUresult m = e_->map(dptr(base + off), page, 0, h, 0);
    if (m != CUDA_SUCCESS) {
      e_->release(h);
      undo();
      check(m, "cuMemMap");
    }
    mapped.emplace_back(base + off, h);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult a = e_->set_access(dptr(base), size, &access, 1);
  if (a != CUDA_SUCCESS) undo();
  check(a, "cuMemSetAccess");
  std::lock_guard<std::mutex> lock(m_);
  page_ = page;
  for (auto& [p, h] : mapped) pages_[reinterpret_cast<uintptr_t>(p)] = h;
  return true;
}

void Vmm::unmap(void* ptr, std::size_t size) {
  std::vector<std::pair<uintptr_t, unsigned long long>> pages;
  std::size_t page = 0;
  {
    std::lock_guard<std::mutex> lock(m_);
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    auto first = pages_.lower_bound(lo);
    auto last = pages_.lower_bound(lo + size);
    pages.assign(first, last);
    pages_.erase(first, last);
    page = page_;
  }
  for (auto& [p, h] : pages) {
    check(e_->unmap(static_cast<CUdeviceptr>(p), page), "cuMemUnmap");
    check(e_->release(h), "cuMemRelease");
  }
}

}  // namespace accel::rt::cuda
