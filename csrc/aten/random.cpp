// Random operators whose schema has no Generator argument. Through the CPU fallback they would
// draw from the CPU's default generator, so torch.accel.manual_seed could not make them
// reproducible; here they are composed from operators that take the accel generator.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>

#include <tuple>

#include "AccelNativeFunctions.h"

namespace accel::aten {

// Dropout as torch.nn.functional.dropout runs it on accelerators: (output, keep mask).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  }
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask =
      at::empty_like(input, input.options().dtype(at::kBool), at::MemoryFormat::Contiguous);
  mask.bernoulli_(keep);  // draws from the accel generator
  return {input.mul(mask).mul_(scale), mask};
}

}  // namespace accel::aten
