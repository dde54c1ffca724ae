// relu on the underlying tier, computing straight into its result.
//
// ATen's CPU relu is clamp_min(self, 0) with a new result, and relu has no out= kernel of its
// own: the generic task would run it and copy the result. The task function (yaml `into:`)
// writes clamp_min into the accel result instead.
#include <ATen/core/Tensor.h>
#include <ATen/ops/clamp_min.h>

#include "AccelNativeFunctions.h"

namespace accel::aten {

// relu(self) -> Tensor
void relu_into(torch::jit::Stack& args, const std::vector<at::Tensor>& results) {
  at::clamp_min_out(const_cast<at::Tensor&>(results[0]), args[0].toTensor(), 0);
}

}  // namespace accel::aten
