// The implementation accel::linear_act uses (ACCEL_LINEAR_KERNEL; see fused_linear.cpp).
#pragma once

#include <cstdint>

namespace accel::aten {

enum class LinearKernel : uint8_t { Auto, Fused, Aten };

LinearKernel linear_kernel();
void set_linear_kernel(LinearKernel kernel);

}  // namespace accel::aten
