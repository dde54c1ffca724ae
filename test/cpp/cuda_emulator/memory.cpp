// The emulated CUDA runtime's memory: device memory the host cannot touch, pinned host memory,
// and the driver API's virtual memory management (cuMem*, reached through
// cudaGetDriverEntryPointByVersion as the cuda driver reaches it).
//
// Each device's addresses are a range mapped without access (PROT_NONE); the bytes live in a
// second mapping of the same size (the shadow, a memfd), where the emulator's copies reach them.
// Virtual memory maps a physical allocation (a memfd) into the shadow at the reserved addresses;
// IPC maps a range of another process's shadow file into this one's at addresses carved here.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "emulator.h"

namespace cuda_emulator {
namespace {

constexpr std::size_t kAlignment = 512;
constexpr std::size_t kGranularity = std::size_t{2} << 20;  // cuMem's, as on NVIDIA GPUs
constexpr std::size_t kPage = 4096;

struct Region {
  char* base = nullptr;      // the device addresses (no host access)
  char* shadow = nullptr;    // the same bytes for the emulator's copies
  std::size_t size = 0;      // addresses: more than the memory, as a GPU's address space is
  std::size_t capacity = 0;  // the device's memory
  std::map<std::size_t, std::size_t> free;      // offset -> size, coalesced
  std::map<std::size_t, std::size_t> used;      // cudaMalloc'd: offset -> size
  std::map<std::size_t, std::size_t> reserved;  // cuMemAddressReserve'd
  std::map<std::size_t, std::size_t> mapped;    // cuMemMap'd
  std::map<std::size_t, std::size_t> opened;    // cudaIpcOpenMemHandle'd
  int shadow_fd = -1;                           // the shadow's file (-1: private memory)
  std::size_t used_bytes = 0;                   // cudaMalloc'd and cuMemCreate'd
};

// Under the global lock. Never destroyed (workers may copy while the process exits).
std::vector<Region>& regions() {
  static auto* r = new std::vector<Region>(static_cast<std::size_t>(std::max(device_count(), 0)));
  return *r;
}
std::map<uintptr_t, std::size_t>& pinned() {
  static auto* p = new std::map<uintptr_t, std::size_t>();
  return *p;
}

Region& region(int device) {
  Region& r = regions()[static_cast<std::size_t>(device)];
  if (r.base == nullptr) {
    r.capacity = device_memory();
    r.size = 8 * r.capacity;
    void* base =
        ::mmap(nullptr, r.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    r.shadow_fd = ::memfd_create("cuda_emulator_device", MFD_CLOEXEC);
    if (r.shadow_fd >= 0 && ::ftruncate(r.shadow_fd, static_cast<off_t>(r.size)) != 0) {
      ::close(r.shadow_fd);
      r.shadow_fd = -1;
    }
    void* shadow = r.shadow_fd >= 0 ? ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE,
                                             MAP_SHARED | MAP_NORESERVE, r.shadow_fd, 0)
                                    : ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED || shadow == MAP_FAILED) {
      std::fprintf(stderr, "cuda emulator: cannot map %zu bytes of device memory\n", r.size);
      std::abort();
    }
    r.base = static_cast<char*>(base);
    r.shadow = static_cast<char*>(shadow);
    r.free[0] = r.size;
  }
  return r;
}

// The region holding device address p, or nullptr.
Region* region_of(const void* p, int* device) {
  const auto* c = static_cast<const char*>(p);
  for (int d = 0; d < device_count(); ++d) {
    Region& r = regions()[static_cast<std::size_t>(d)];
    if (r.base != nullptr && c >= r.base && c < r.base + r.size) {
      if (device != nullptr) *device = d;
      return &r;
    }
  }
  return nullptr;
}

// Address space: `size` bytes aligned to `align` from the free list; npos if none.
constexpr std::size_t kNone = ~std::size_t{0};
std::size_t carve(Region& r, std::size_t size, std::size_t align) {
  for (auto it = r.free.begin(); it != r.free.end(); ++it) {
    const std::size_t start = (it->first + align - 1) / align * align;
    const std::size_t end = it->first + it->second;
    if (start + size > end) continue;
    const std::size_t head = start - it->first;
    r.free.erase(it);
    if (head > 0) r.free[start - head] = head;
    if (end > start + size) r.free[start + size] = end - start - size;
    return start;
  }
  return kNone;
}

void give_back(Region& r, std::size_t start, std::size_t size) {
  auto next = r.free.find(start + size);
  if (next != r.free.end()) {
    size += next->second;
    r.free.erase(next);
  }
  auto prev = r.free.lower_bound(start);
  if (prev != r.free.begin()) {
    --prev;
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      r.free.erase(prev);
    }
  }
  r.free[start] = size;
}

// Gives the shadow's pages of [off, off + size) back (page-aligned) and, when `remap`, maps the
// shadow's own memory there again (after a cuMemMap or an IPC mapping replaced it).
void drop_pages(Region& r, std::size_t off, std::size_t size, bool remap) {
  if (remap) {
    if (r.shadow_fd >= 0) {
      ::mmap(r.shadow + off, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, r.shadow_fd,
             static_cast<off_t>(off));
    } else {
      ::mmap(r.shadow + off, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
  }
  const std::size_t first = (off + kPage - 1) / kPage * kPage;
  const std::size_t last = (off + size) / kPage * kPage;
  if (last <= first) return;
  if (r.shadow_fd >= 0) {
    ::fallocate(r.shadow_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
                static_cast<off_t>(last - first));
  } else {
    ::madvise(r.shadow + first, last - first, MADV_DONTNEED);
  }
}

// Whether [off, off + n) lies in one allocation of `m` (mapped ranges: in contiguous ones).
bool covered(const std::map<std::size_t, std::size_t>& m, std::size_t off, std::size_t n,
             bool contiguous) {
  auto it = m.upper_bound(off);
  if (it == m.begin()) return false;
  --it;
  std::size_t end = it->first + it->second;
  while (contiguous && end < off + n) {
    auto next = m.find(end);
    if (next == m.end()) return false;
    end += next->second;
  }
  return off + n <= end;
}

// Physical allocations of the driver API: a memfd each.
struct Physical {
  int fd = -1;
  std::size_t size = 0;
  int device = 0;
};

CUresult emu_get_error_name(CUresult e, const char** name) {
  switch (e) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
  }
  return CUDA_SUCCESS;
}
CUresult emu_device_get(CUdevice* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}
CUresult emu_device_attribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *value = attribute == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? 1 : 0;
  return CUDA_SUCCESS;
}
CUresult emu_granularity(std::size_t* g, const CUmemAllocationProp*,
                         CUmemAllocationGranularity_flags) {
  *g = kGranularity;
  return CUDA_SUCCESS;
}
CUresult emu_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t align, CUdeviceptr,
                     unsigned long long) {
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(global_mutex());
  Region& r = region(current_device());
  const std::size_t off = carve(r, size, std::max(align, kGranularity));
  if (off == kNone) return CUDA_ERROR_OUT_OF_MEMORY;
  r.reserved[off] = size;
  *ptr = reinterpret_cast<CUdeviceptr>(r.base + off);
  return CUDA_SUCCESS;
}
CUresult emu_address_free(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(global_mutex());
  const auto* p = reinterpret_cast<const char*>(ptr);
  Region* r = region_of(p, nullptr);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t off = static_cast<std::size_t>(p - r->base);
  auto it = r->reserved.find(off);
  if (it == r->reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = r->mapped.lower_bound(off);
  if (m != r->mapped.end() && m->first < off + size) return CUDA_ERROR_INVALID_VALUE;  // mapped
  r->reserved.erase(it);
  give_back(*r, off, size);
  return CUDA_SUCCESS;
}
CUresult emu_create(CUmemGenericAllocationHandle* handle, std::size_t size,
                    const CUmemAllocationProp* prop, unsigned long long) {
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = prop->location.id;
  if (device < 0 || device >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    Region& r = region(device);
    if (r.used_bytes + size > r.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
    r.used_bytes += size;
  }
  auto* phys = new Physical{::memfd_create("cuda_emulator", 0), size, device};
  if (phys->fd < 0 || ::ftruncate(phys->fd, static_cast<off_t>(size)) != 0) {
    std::fprintf(stderr, "cuda emulator: memfd of %zu bytes failed\n", size);
    std::abort();
  }
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(phys);
  return CUDA_SUCCESS;
}
CUresult emu_release(CUmemGenericAllocationHandle handle) {
  auto* phys = reinterpret_cast<Physical*>(handle);
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    region(phys->device).used_bytes -= phys->size;
  }
  ::close(phys->fd);  // a mapping still holds the memory until it is unmapped
  delete phys;
  return CUDA_SUCCESS;
}
CUresult emu_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                 CUmemGenericAllocationHandle handle, unsigned long long) {
  auto* phys = reinterpret_cast<Physical*>(handle);
  const auto* p = reinterpret_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(global_mutex());
  Region* r = region_of(p, nullptr);
  if (r == nullptr || offset + size > phys->size) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t off = static_cast<std::size_t>(p - r->base);
  if (!covered(r->reserved, off, size, false)) return CUDA_ERROR_INVALID_VALUE;
  auto m = r->mapped.lower_bound(off);
  if (m != r->mapped.end() && m->first < off + size) return CUDA_ERROR_INVALID_VALUE;
  if (m != r->mapped.begin() && std::prev(m)->first + std::prev(m)->second > off) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (::mmap(r->shadow + off, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, phys->fd,
             static_cast<off_t>(offset)) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  r->mapped[off] = size;
  return CUDA_SUCCESS;
}
CUresult emu_unmap(CUdeviceptr ptr, std::size_t size) {
  const auto* p = reinterpret_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(global_mutex());
  Region* r = region_of(p, nullptr);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t off = static_cast<std::size_t>(p - r->base);
  auto it = r->mapped.find(off);
  if (it == r->mapped.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  r->mapped.erase(it);
  drop_pages(*r, off, size, /*remap=*/true);
  return CUDA_SUCCESS;
}
CUresult emu_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc*, std::size_t) {
  const auto* p = reinterpret_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(global_mutex());
  Region* r = region_of(p, nullptr);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return covered(r->mapped, static_cast<std::size_t>(p - r->base), size, true)
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

void* driver_entry(const char* name) {
  if (const char* v = std::getenv("CUDA_EMULATOR_VMM"); v != nullptr && std::strcmp(v, "0") == 0) {
    return nullptr;  // a driver without virtual memory management
  }
  const std::pair<const char*, void*> entries[] = {
      {"cuGetErrorName", reinterpret_cast<void*>(&emu_get_error_name)},
      {"cuDeviceGet", reinterpret_cast<void*>(&emu_device_get)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&emu_device_attribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&emu_granularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&emu_reserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&emu_address_free)},
      {"cuMemCreate", reinterpret_cast<void*>(&emu_create)},
      {"cuMemRelease", reinterpret_cast<void*>(&emu_release)},
      {"cuMemMap", reinterpret_cast<void*>(&emu_map)},
      {"cuMemUnmap", reinterpret_cast<void*>(&emu_unmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&emu_set_access)},
  };
  for (const auto& [n, fn] : entries) {
    if (std::strcmp(n, name) == 0) return fn;
  }
  return nullptr;
}

}  // namespace

Access classify(const void* p, std::size_t n) {
  int device = -1;
  if (Region* r = region_of(p, &device)) {
    const std::size_t off = static_cast<std::size_t>(static_cast<const char*>(p) - r->base);
    if (covered(r->used, off, n, false) || covered(r->mapped, off, n, true) ||
        covered(r->opened, off, n, false)) {
      return {Kind::Device, r->shadow + off, device};
    }
    return {Kind::Bad, nullptr, device};
  }
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = pinned().upper_bound(a);
  if (it != pinned().begin()) {
    --it;
    if (a + n <= it->first + it->second) {
      return {Kind::Pinned, static_cast<char*>(const_cast<void*>(p)), -1};
    }
  }
  return {Kind::Pageable, static_cast<char*>(const_cast<void*>(p)), -1};
}

}  // namespace cuda_emulator

using namespace cuda_emulator;

extern "C" {

cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  EMU_ENTER();
  std::lock_guard<std::mutex> lock(global_mutex());
  Region& r = region(current_device());
  *total = r.capacity;
  *free = r.capacity - std::min(r.used_bytes, r.capacity);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, std::size_t size) {
  EMU_ENTER();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = unsafe_call(); e != cudaSuccess) return fail(e);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(global_mutex());
  Region& r = region(current_device());
  const std::size_t n = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (r.used_bytes + n > r.capacity) return fail(cudaErrorMemoryAllocation);
  const std::size_t off = carve(r, n, kAlignment);
  if (off == kNone) return fail(cudaErrorMemoryAllocation);
  r.used[off] = n;
  r.used_bytes += n;
  *ptr = r.base + off;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  EMU_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  if (const cudaError_t e = unsafe_call(); e != cudaSuccess) return fail(e);
  // cudaFree waits for the device's work first (it synchronizes implicitly).
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    if (region_of(ptr, &device) == nullptr) return fail(cudaErrorInvalidValue);
  }
  const int saved = current_device();
  (void)cudaSetDevice(device);
  (void)cudaDeviceSynchronize();
  (void)cudaSetDevice(saved);
  std::lock_guard<std::mutex> lock(global_mutex());
  Region& r = region(device);
  const std::size_t off = static_cast<std::size_t>(static_cast<char*>(ptr) - r.base);
  auto it = r.used.find(off);
  if (it == r.used.end()) return fail(cudaErrorInvalidValue);
  const std::size_t size = it->second;
  r.used.erase(it);
  r.used_bytes -= size;
  // Large frees give their whole pages back (only those inside the block: a neighbour's bytes
  // stay).
  if (size >= (std::size_t{1} << 20)) drop_pages(r, off, size, /*remap=*/false);
  give_back(r, off, size);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, std::size_t size, unsigned int) {
  EMU_ENTER();
  if (const cudaError_t e = unsafe_call(); e != cudaSuccess) return fail(e);
  void* p = std::aligned_alloc(kPage, (std::max<std::size_t>(size, 1) + kPage - 1) / kPage * kPage);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(global_mutex());
  pinned()[reinterpret_cast<uintptr_t>(p)] = size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  EMU_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  if (const cudaError_t e = unsafe_call(); e != cudaSuccess) return fail(e);
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    if (pinned().erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return fail(cudaErrorInvalidValue);
  }
  std::free(ptr);
  return cudaSuccess;
}

// IPC handles name a cudaMalloc allocation: its process, device, the shadow file there, and the
// allocation's range in it. Opening maps that range of the other process's shadow file into this
// process's, at addresses carved on the current device (as CUDA maps the peer's memory).
namespace {
struct IpcHandleData {
  char magic[8];
  int64_t pid;
  int32_t device;
  int32_t fd;
  uint64_t offset;
  uint64_t size;
};
constexpr char kIpcMagic[8] = {'e', 'm', 'u', 'l', 'i', 'p', 'c', '1'};
}  // namespace

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  EMU_ENTER();
  if (handle == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(global_mutex());
  int device = -1;
  Region* r = region_of(ptr, &device);
  if (r == nullptr) return fail(cudaErrorInvalidValue);
  if (r->shadow_fd < 0) return fail(cudaErrorNotSupported);
  const auto off = static_cast<std::size_t>(static_cast<char*>(ptr) - r->base);
  auto it = r->used.upper_bound(off);
  if (it == r->used.begin()) return fail(cudaErrorInvalidValue);
  --it;
  if (off >= it->first + it->second) return fail(cudaErrorInvalidValue);
  IpcHandleData h{};
  std::memcpy(h.magic, kIpcMagic, sizeof(kIpcMagic));
  h.pid = ::getpid();
  h.device = device;
  h.fd = r->shadow_fd;
  h.offset = it->first;
  h.size = it->second;
  static_assert(sizeof(h) <= sizeof(*handle));
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned int) {
  EMU_ENTER();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  IpcHandleData h{};
  std::memcpy(&h, &handle, sizeof(h));
  // CUDA refuses handles of the calling process itself.
  if (std::memcmp(h.magic, kIpcMagic, sizeof(kIpcMagic)) != 0 || h.pid == ::getpid()) {
    return fail(cudaErrorInvalidValue);
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/fd/%d", static_cast<long long>(h.pid), h.fd);
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(global_mutex());
  Region& r = region(current_device());
  const std::size_t n = (h.size + kPage - 1) / kPage * kPage;
  const std::size_t off = carve(r, n, kPage);
  void* mapped = off == kNone ? MAP_FAILED
                              : ::mmap(r.shadow + off, h.size, PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(h.offset));
  ::close(fd);
  if (mapped == MAP_FAILED) {
    if (off != kNone) give_back(r, off, n);
    return fail(cudaErrorMemoryAllocation);
  }
  r.opened[off] = n;
  *ptr = r.base + off;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  EMU_ENTER();
  std::lock_guard<std::mutex> lock(global_mutex());
  Region* r = region_of(ptr, nullptr);
  if (r == nullptr) return fail(cudaErrorInvalidValue);
  const auto off = static_cast<std::size_t>(static_cast<char*>(ptr) - r->base);
  auto it = r->opened.find(off);
  if (it == r->opened.end()) return fail(cudaErrorInvalidValue);
  const std::size_t n = it->second;
  r->opened.erase(it);
  drop_pages(*r, off, n, /*remap=*/true);
  give_back(*r, off, n);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* ptr) {
  EMU_ENTER();
  std::memset(a, 0, sizeof(*a));
  std::lock_guard<std::mutex> lock(global_mutex());
  const Access acc = classify(ptr, 1);
  a->device = -2;
  if (acc.kind == Kind::Device) {
    a->type = cudaMemoryTypeDevice;
    a->device = acc.device;
    a->devicePointer = const_cast<void*>(ptr);
  } else if (acc.kind == Kind::Pinned) {
    a->type = cudaMemoryTypeHost;
    a->device = current_device();
    a->devicePointer = a->hostPointer = const_cast<void*>(ptr);
  } else {
    a->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  EMU_ENTER();
  *fn = driver_entry(symbol);
  if (status != nullptr) {
    *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

}  // extern "C"

// For tests that stand for another library allocating device memory (a pluggable allocator
// calling cudaMalloc): the emulator's cudaMalloc and cudaFree under names of their own (the CUDA
// names stay hidden, so that the driver never binds to a real libcudart's).
extern "C" __attribute__((visibility("default"))) void* cuda_emulator_malloc(std::size_t size) {
  void* p = nullptr;
  return cudaMalloc(&p, size) == cudaSuccess ? p : nullptr;
}
extern "C" __attribute__((visibility("default"))) void cuda_emulator_free(void* ptr) {
  (void)cudaFree(ptr);
}

// For the emulated NVML (nvml.cpp, another library): the devices, each one's memory, and the
// device memory in use on `device`.
extern "C" __attribute__((visibility("default"))) int cuda_emulator_device_count() {
  return cuda_emulator::device_count();
}
extern "C" __attribute__((visibility("default"))) std::size_t cuda_emulator_device_memory() {
  return cuda_emulator::device_memory();
}
extern "C" __attribute__((visibility("default"))) std::size_t cuda_emulator_memory_used(
    int device) {
  if (device < 0 || device >= cuda_emulator::device_count()) return 0;
  std::lock_guard<std::mutex> lock(cuda_emulator::global_mutex());
  return region(device).used_bytes;
}
