// CUDA's virtual memory management (the driver API's cuMem* calls) for the cuda driver's
// va_* calls, which expandable segments use. cudart is linked statically and offers no cuMem*:
// the entries come from the CUDA driver through cudaGetDriverEntryPointByVersion. Memory is
// mapped one granularity page at a time (one allocation handle each), so that any page can be
// unmapped again, as c10's expandable segments do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace accel::rt::cuda {

class Vmm {
 public:
  // Finds the entries and checks that `device` supports virtual memory management; false with
  // `why` otherwise (the driver then reports no virtual memory).
  bool load(int device, std::string& why);
  std::size_t granularity(int device);
  void* reserve(std::size_t size);
  void release(void* ptr, std::size_t size);
  // False when the device has no memory for it (nothing stays mapped then).
  bool map(int device, void* ptr, std::size_t size);
  // The caller has waited for the work that used the pages.
  void unmap(void* ptr, std::size_t size);

 private:
  struct Entries;
  // Throws the runtime's error for a failed cuMem* call (OutOfMemoryError for no memory).
  void check(int result, const char* call) const;

  Entries* e_ = nullptr;  // loaded once, never freed (the driver lives for the process)
  std::mutex m_;
  std::size_t page_ = 0;                           // the granularity the pages were mapped with
  std::map<uintptr_t, unsigned long long> pages_;  // page address -> allocation handle
};

}  // namespace accel::rt::cuda
