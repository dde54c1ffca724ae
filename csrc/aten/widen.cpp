// Dtypes CUDA's kernel takes and the CPU's does not (yaml `widen`): libraries treat every device
// that is not the CPU like CUDA (transformers calls histc on int32 tensors there). On the host
// driver such a call runs with those tensors converted to a dtype the CPU kernel takes, and its
// new results converted back; tensors it writes (in-place, out=) get the results copied in.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "aten/host_task.h"
#include "aten/underlying.h"

namespace accel::aten {
namespace {

std::optional<c10::ScalarType> first_dtype(const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined()) return v.toTensor().scalar_type();
    if (v.isTensorList() && !v.toTensorList().empty()) {
      return v.toTensorList().get(0).scalar_type();
    }
  }
  return std::nullopt;
}

std::optional<c10::ScalarType> widened(const int8_t* pairs, c10::ScalarType from) {
  for (const int8_t* p = pairs; *p != -1; p += 2) {
    if (p[0] == static_cast<int8_t>(from)) return static_cast<c10::ScalarType>(p[1]);
  }
  return std::nullopt;
}

}  // namespace

bool widened_call(const OpConfig& config, const c10::OperatorHandle& op,
                  torch::jit::Stack* stack) {
  if (config.widen == nullptr || !host_accessible()) return false;
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const std::optional<c10::ScalarType> from = first_dtype(*stack, begin);
  if (!from) return false;
  const std::optional<c10::ScalarType> to = widened(config.widen, *from);
  if (!to) return false;

  const auto widen = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == *from ? t.to(*to) : t;
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (the argument, its wide copy)
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const bool write = alias != nullptr && alias->isWrite();
    if (v.isTensor()) {
      at::Tensor wide = widen(v.toTensor());
      if (write && !wide.is_same(v.toTensor())) written.emplace_back(v.toTensor(), wide);
      v = std::move(wide);
    } else if (v.isTensorList()) {
      TORCH_CHECK(!write, config.name, ": widening a written tensor list is not supported");
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : v.toTensorVector()) ts.push_back(widen(t));
      v = std::move(ts);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
  for (auto& [arg, wide] : written) {
    if (!arg.sizes().equals(wide.sizes())) arg.resize_(wide.sizes());  // an out= the kernel sized
    arg.copy_(wide);
  }
  const size_t n_returns = schema.returns().size();
  for (size_t j = stack->size() - n_returns; j < stack->size(); ++j) {
    c10::IValue& r = (*stack)[j];
    if (!r.isTensor() || !r.toTensor().defined()) continue;
    const at::Tensor& t = r.toTensor();
    const auto w = std::find_if(written.begin(), written.end(),
                                [&](const auto& p) { return p.second.is_same(t); });
    if (w != written.end()) {
      r = w->first;  // the argument the result aliases
    } else if (t.scalar_type() == *to) {
      r = t.to(*from);
    }
  }
  return true;
}

}  // namespace accel::aten
