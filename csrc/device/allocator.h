// The allocators PyTorch uses for accel: device memory and pinned host memory.
#pragma once

#include <c10/core/Allocator.h>

namespace accel::device {

// The c10::DeviceAllocator registered for PrivateUse1 (the runtime's caching allocator).
c10::Allocator* device_allocator();
// The at::HostAllocator registered for PrivateUse1 (the runtime's pinned memory).
c10::Allocator* host_allocator();
// Gives the runtime's caching allocator PyTorch's device-generic allocator settings
// (PYTORCH_ALLOC_CONF, read by c10's AcceleratorAllocatorConfig): max_split_size_mb,
// max_non_split_rounding_mb, garbage_collection_threshold, roundup_power2_divisions,
// expandable_segments. Done before the first allocation, and again when
// torch.accel.memory._set_allocator_settings changes them.
void apply_allocator_config();
// Device memory another process shared (rt::ipc_import's pointer): released with
// rt::ipc_release when the storage dies.
c10::DataPtr import_data_ptr(void* ptr, int device);

}  // namespace accel::device
