// The fused operators on the cuda driver: their Triton implementations (torch_accel/ops/_cuda.py)
// run on CUDA views of the accel tensors, in accel stream order.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Device.h>

namespace accel::aten {

// Whether accel tensors of this process run the fused operators' CUDA implementations.
bool fused_on_cuda();

// Calls the operator `name` ("accel::_rms_norm_rope_cuda") with `args`, every accel tensor
// among them replaced by a CUDA tensor over the same memory, inside the KernelScope of accel
// device `device` (PyTorch's current CUDA stream is the accel stream). Results are written into
// tensors among the arguments.
void call_cuda_impl(c10::DeviceIndex device, const char* name, torch::jit::Stack args);

}  // namespace accel::aten
