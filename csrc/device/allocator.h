// The allocators PyTorch uses for accel: device memory and pinned host memory.
#pragma once

#include <c10/core/Allocator.h>

namespace accel::device {

// The c10::DeviceAllocator registered for PrivateUse1 (the runtime's caching allocator).
c10::Allocator* device_allocator();
// The at::HostAllocator registered for PrivateUse1 (the runtime's pinned memory).
c10::Allocator* host_allocator();

}  // namespace accel::device
