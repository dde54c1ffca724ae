// What CUDA's kernels take and the CPU's do not: libraries treat every device that is not the
// CPU like CUDA (transformers calls histc on int32 tensors there), so accel takes it too.
// - Dtypes (yaml `widen`): on the host driver such a call runs with those tensors converted to a
//   dtype the CPU kernel takes, and its new results converted back; tensors it writes (in-place,
//   out=) get the results copied in.
// - Other arguments (yaml `cuda_like`): a function per operator that computes the call from
//   other accel operators, as CUDA's kernel would.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_embedding_bag_forward_only.h>
#include <ATen/ops/_linalg_check_errors.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/dispatch_util.h"
#include "aten/host_task.h"
#include "aten/underlying.h"

namespace accel::aten {
namespace {

// The (from, to) pairs of OpConfig::widen.
std::vector<std::pair<c10::ScalarType, c10::ScalarType>> pairs_of(const int8_t* pairs) {
  std::vector<std::pair<c10::ScalarType, c10::ScalarType>> out;
  for (const int8_t* p = pairs; *p != -1; p += 2) {
    out.emplace_back(static_cast<c10::ScalarType>(p[0]), static_cast<c10::ScalarType>(p[1]));
  }
  return out;
}

// The tensor, or the tensors of the list, an argument holds.
template <class F>
void for_each_tensor_of(const c10::IValue& v, F f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) f(t);
  }
}

template <class F>
void for_each_tensor(const torch::jit::Stack& stack, size_t begin, F f) {
  for (size_t i = begin; i < stack.size(); ++i) for_each_tensor_of(stack[i], f);
}

using DtypePairs = std::vector<std::pair<c10::ScalarType, c10::ScalarType>>;

// The pairs of `table` whose narrow dtype some tensor argument on stack[begin:] has.
DtypePairs narrow_pairs(const DtypePairs& table, const torch::jit::Stack& stack, size_t begin) {
  DtypePairs active;
  for_each_tensor(stack, begin, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    for (const auto& p : table) {
      if (p.first == t.scalar_type() &&
          std::find(active.begin(), active.end(), p) == active.end()) {
        active.push_back(p);
      }
    }
  });
  return active;
}

bool promotes_with_numbers(const c10::FunctionSchema& schema) {
  return schema.name() == "aten::pow" || schema.name() == "aten::pow_";
}

}  // namespace

bool may_widen(const OpConfig& config, const c10::OperatorHandle& op,
               const torch::jit::Stack& stack) {
  if (config.widen == nullptr || !host_accessible()) return false;
  const c10::FunctionSchema& schema = op.schema();
  if (promotes_with_numbers(schema)) return true;  // its numbers decide too (widened_call)
  return !narrow_pairs(pairs_of(config.widen), stack, stack.size() - schema.arguments().size())
              .empty();
}

bool widened_call(const OpConfig& config, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (config.widen == nullptr || !host_accessible()) return false;
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const DtypePairs table = pairs_of(config.widen);
  DtypePairs active = narrow_pairs(table, *stack, begin);
  // pow of a float16 tensor and a complex Python number or a complex32 tensor computes in
  // complex32 (pow(1j, x) of a float16 x; CUDA's kernel takes it): its float16 tensors are
  // widened to complex64 as well, and complex64 results go back to complex32. Not where a
  // float16 tensor is written: the CPU kernel raises that complex results cannot be cast to it,
  // as CUDA's does. pow only: other operators do not promote with their numbers (lerp's weight
  // is converted to the tensors' dtype, and a complex one is refused).
  const std::pair<c10::ScalarType, c10::ScalarType> complex_half{c10::kComplexHalf,
                                                                 c10::kComplexFloat};
  if (promotes_with_numbers(schema) &&
      std::find(table.begin(), table.end(), complex_half) != table.end()) {
    bool complex_number = false;
    bool half_read = false;
    bool half_written = false;
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = (*stack)[begin + i];
      const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
      complex_number = complex_number || v.isComplexDouble();
      const bool write = alias != nullptr && alias->isWrite();
      for_each_tensor_of(v, [&](const at::Tensor& t) {
        if (t.defined() && t.scalar_type() == c10::kHalf) (write ? half_written : half_read) = true;
      });
    }
    const bool complex_half_tensor =
        std::find(active.begin(), active.end(), complex_half) != active.end();
    if ((complex_number || complex_half_tensor) && half_read && !half_written) {
      // first: complex64 narrows to complex32
      if (!complex_half_tensor) active.insert(active.begin(), complex_half);
      active.emplace_back(c10::kHalf, c10::kComplexFloat);
    }
  }
  if (active.empty()) return false;
  // An explicit result dtype (sum(x, dtype=...)) is what the results must keep.
  bool explicit_dtype = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    explicit_dtype = explicit_dtype || (schema.arguments()[i].name() == "dtype" && !v.isNone());
  }

  const auto widen = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    for (const auto& [from, to] : active) {
      if (t.scalar_type() == from) return t.to(to);
    }
    return t;
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
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : v.toTensorVector()) {
        ts.push_back(widen(t));
        if (write && !ts.back().is_same(t)) written.emplace_back(t, ts.back());  // _foreach_abs_
      }
      v = std::move(ts);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
  for (auto& [arg, wide] : written) {
    if (!arg.sizes().equals(wide.sizes())) arg.resize_(wide.sizes());  // an out= the kernel sized
    arg.copy_(wide);
  }
  // New results in a wide dtype of the table go back to its narrow dtype, the one CUDA's kernel
  // returns (an fft of float16 is complex32 there, an angle of complex32 is float16); the first
  // active pair wins where several narrow dtypes share a wide one (histc's integers).
  const auto narrow = [&](c10::ScalarType wide) -> std::optional<c10::ScalarType> {
    for (const auto& [from, to] : active) {
      if (to == wide) return from;
    }
    for (const auto& [from, to] : table) {
      if (to == wide) return from;
    }
    return std::nullopt;
  };
  const size_t n_returns = schema.returns().size();
  for (size_t j = stack->size() - n_returns; j < stack->size(); ++j) {
    c10::IValue& r = (*stack)[j];
    if (r.isTensorList() && !explicit_dtype) {  // _foreach_abs of bool tensors
      std::vector<at::Tensor> ts = r.toTensorVector();
      for (at::Tensor& t : ts) {
        if (!t.defined()) continue;
        if (const std::optional<c10::ScalarType> back = narrow(t.scalar_type())) t = t.to(*back);
      }
      r = std::move(ts);
      continue;
    }
    if (!r.isTensor() || !r.toTensor().defined()) continue;
    const at::Tensor& t = r.toTensor();
    const auto w = std::find_if(written.begin(), written.end(),
                                [&](const auto& p) { return p.second.is_same(t); });
    if (w != written.end()) {
      r = w->first;  // the argument the result aliases
    } else if (explicit_dtype) {
      continue;
    } else if (const std::optional<c10::ScalarType> back = narrow(t.scalar_type())) {
      r = t.to(*back);
    }
  }
  return true;
}

namespace {

// offset2bag (the bag of each index) and bag_size (the indices in each bag, one per offset) of
// 1-D indices and offsets of the same dtype, as the CPU's backward computes offset2bag.
std::pair<at::Tensor, at::Tensor> bag_bookkeeping(const at::Tensor& indices,
                                                  const at::Tensor& offsets) {
  // One more element than indices: offsets may hold indices.size(0) (empty trailing bags).
  at::Tensor bags = at::zeros({indices.size(0) + 1}, indices.options());
  bags.index_add_(0, offsets, at::ones({offsets.size(0)}, indices.options()));
  bags.narrow(0, 0, 1).sub_(1);
  at::Tensor offset2bag = bags.cumsum(0, indices.scalar_type()).narrow(0, 0, indices.size(0));
  at::Tensor bag_size = at::zeros(offsets.sizes(), indices.options());
  bag_size.index_add_(0, offset2bag, at::ones_like(offset2bag));
  return {std::move(offset2bag), std::move(bag_size)};
}

}  // namespace

void call_again(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool& inside) {
  inside = true;
  const auto reset = c10::make_scope_exit([&inside] { inside = false; });
  op.callBoxed(stack);
}

void convert_tensors(torch::jit::Stack* stack, std::initializer_list<size_t> positions,
                     c10::ScalarType dtype) {
  for (size_t i : positions) {
    if ((*stack)[i].isNone()) continue;
    const at::Tensor t = (*stack)[i].toTensor();
    if (t.defined() && t.scalar_type() != dtype) (*stack)[i] = t.to(dtype);
  }
}

bool is_out_form(const c10::FunctionSchema& schema) {
  const std::string& overload = schema.overload_name();
  return overload == "out" || (overload.size() > 4 && overload.ends_with("_out"));
}

bool out_through_functional(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (!is_out_form(schema)) return false;
  std::string overload = schema.overload_name();
  overload = overload == "out" ? "" : overload.substr(0, overload.size() - 4);
  const auto& arguments = schema.arguments();
  const size_t begin = stack->size() - arguments.size();
  const c10::OperatorHandle functional =
      c10::Dispatcher::singleton().findSchemaOrThrow(schema.name().c_str(), overload.c_str());
  size_t inputs = 0;
  while (inputs < arguments.size() && !arguments[inputs].is_out()) ++inputs;
  torch::jit::Stack call(stack->begin() + begin, stack->begin() + begin + inputs);
  functional.callBoxed(&call);
  std::vector<at::Tensor> outs;
  for (size_t i = inputs; i < arguments.size(); ++i) outs.push_back((*stack)[begin + i].toTensor());
  TORCH_INTERNAL_ASSERT(call.size() == outs.size(), schema.name(), ": unexpected results");
  for (size_t i = 0; i < outs.size(); ++i) {
    const at::Tensor& result = call[i].toTensor();
    const std::string& name = arguments[inputs + i].name();
    TORCH_CHECK(outs[i].device() == result.device(), schema.name(), ": out argument ", name,
                " is on ", outs[i].device(), ", expected ", result.device());
    TORCH_CHECK(c10::canCast(result.scalar_type(), outs[i].scalar_type()), schema.name(),
                ": result type ", result.scalar_type(),
                " can't be cast to the desired output type ", outs[i].scalar_type(),
                " (out argument ", name, ")");
    at::native::resize_output(outs[i], result.sizes());
    outs[i].copy_(result);
  }
  torch::jit::drop(*stack, arguments.size());
  for (auto& t : outs) stack->emplace_back(std::move(t));
  return true;
}

// _embedding_bag and _embedding_bag_forward_only (weight, indices, offsets, ...) -> (output,
// offset2bag, bag_size, max_indices): CUDA's kernels return offset2bag, the bag of each index,
// and the meta functions (fake tensors, torch.compile, graph capture) size it so; the CPU
// kernel leaves it empty on its fast path (sum without per-sample weights or padding), and
// bag_size zero. Filled here as the CPU's backward computes offset2bag where it finds it
// empty, bag_size as the count of each bag. max_indices, which only mode
// max has, is empty in the other modes as CUDA's (the CPU's has bag_size's shape; its backward
// does not read it there), bag_size has one element per offset. Indices and offsets of
// different dtypes keep the CPU's offset2bag and dtypes. out= forms write the functional form's
// results.
bool embedding_bag_offset2bag(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  thread_local bool inside = false;  // the call below comes back here
  if (inside) return false;
  if (out_through_functional(op, stack)) return true;
  const size_t begin = stack->size() - op.schema().arguments().size();
  const at::Tensor indices = (*stack)[begin + 1].toTensor();
  const at::Tensor offsets = (*stack)[begin + 2].toTensor();
  constexpr int64_t kMax = 2;  // modes: sum, mean, max
  const int64_t mode = (*stack)[begin + 4].toInt();
  call_again(op, stack, inside);
  if (indices.dim() != 1 || offsets.dim() != 1) return true;  // (the kernel refused them)
  if (mode != kMax && (*stack)[begin + 3].toTensor().numel() != 0) {
    (*stack)[begin + 3] = at::empty({0}, indices.options());  // no max_indices without max
  }
  // bag_size: one per offset (with include_last_offset the last is 0).
  const at::Tensor sizes = (*stack)[begin + 2].toTensor();
  if (sizes.size(0) != offsets.size(0)) {
    at::Tensor sized = at::zeros(offsets.sizes(), sizes.options());
    sized.narrow(0, 0, sizes.size(0)).copy_(sizes);
    (*stack)[begin + 2] = sized;
  }
  if ((*stack)[begin + 1].toTensor().numel() == indices.numel()) return true;
  // Left empty for indices and offsets of different dtypes: the CPU's backward kernels then
  // want offset2bag in different ones.
  if (indices.scalar_type() != offsets.scalar_type()) return true;
  auto [offset2bag, bag_size] = bag_bookkeeping(indices, offsets);  // (the fast path's are 0)
  (*stack)[begin + 1] = std::move(offset2bag);
  (*stack)[begin + 2] = std::move(bag_size);
  return true;
}

// The task of the operators above: the CPU kernel's results, except where a graph capture that
// was the first call of its signature allocated results from the meta functions; those get the
// values embedding_bag_offset2bag gives (it replaces the others anyway; the task must not fail).
void embedding_bag_into(torch::jit::Stack& args, const std::vector<at::Tensor>& results) {
  const at::Tensor indices = args[1].toTensor();
  const at::Tensor offsets = args[2].toTensor();
  const std::optional<at::Tensor> weights =
      args[6].isNone() ? std::nullopt : std::optional<at::Tensor>(args[6].toTensor());
  const auto cpu = at::_embedding_bag_forward_only(
      args[0].toTensor(), indices, offsets, args[3].toBool(), args[4].toInt(), args[5].toBool(),
      weights, args[7].toBool(), args[8].toInt());
  const std::array<at::Tensor, 4> got = {std::get<0>(cpu), std::get<1>(cpu), std::get<2>(cpu),
                                         std::get<3>(cpu)};
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].defined() || results[i].sizes() != got[i].sizes()) continue;
    results[i].copy_(got[i]);
  }
  const bool own = results[1].defined() && results[1].sizes() != got[1].sizes();
  if (own || (results[2].defined() && results[2].sizes() != got[2].sizes())) {
    const auto [offset2bag, bag_size] = bag_bookkeeping(indices, offsets);
    if (own) results[1].copy_(offset2bag);
    // (_embedding_bag's CPU kernel gives one per bag, one fewer with include_last_offset)
    if (results[2].sizes() != got[2].sizes()) {
      results[2].copy_(bag_size.narrow(0, 0, results[2].size(0)));
    }
  }
}

// nansum (and nanmean, which calls it) of complex tensors: the CPU kernel refuses them; CUDA's
// skips the elements with a NaN part. Computed as the sum of the tensor with those elements
// zeroed (nansum and sum take the same arguments, out= included).
bool nansum_complex(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const size_t begin = stack->size() - n;
  const at::Tensor self = (*stack)[begin].toTensor();
  if (!self.is_complex()) return false;
  const at::Tensor zero = at::scalar_tensor(0, self.options());
  (*stack)[begin] = at::where(at::isnan(self), zero, self);
  const bool out = op.schema().overload_name() == "out";
  static const c10::OperatorHandle sum =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::sum", "dim_IntList");
  static const c10::OperatorHandle sum_out =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::sum", "IntList_out");
  (out ? sum_out : sum).callBoxed(stack);
  return true;
}

// _foreach_pow of float16 tensors with complex numbers: computed per tensor as pow computes it
// (in complex32, as CUDA's kernels do), each result of its own dtype (a list of numbers mixes
// real and complex ones). In place, pow_ raises where a float16 tensor cannot hold the result.
bool foreach_pow_complex_half(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const std::string& overload = schema.overload_name();
  if (overload.ends_with("_out") || n != 2) return false;
  bool half = false;
  bool complex_number = false;
  for (size_t i = begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    complex_number = complex_number || v.isComplexDouble();
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) half = half || t.scalar_type() == c10::kHalf;
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        complex_number = complex_number || e.isComplexDouble();
    }
  }
  if (!half || !complex_number) return false;
  const bool in_place = schema.name() == "aten::_foreach_pow_";
  std::vector<at::Tensor> results;
  if (overload == "ScalarAndTensor") {  // a number to the powers of the tensors
    const c10::Scalar base = (*stack)[begin].toScalar();
    for (const at::Tensor& e : (*stack)[begin + 1].toTensorVector())
      results.push_back(at::pow(base, e));
  } else {
    const std::vector<at::Tensor> self = (*stack)[begin].toTensorVector();
    const c10::IValue& exponent = (*stack)[begin + 1];
    for (size_t i = 0; i < self.size(); ++i) {
      const c10::Scalar e =
          exponent.isList() ? exponent.toListRef()[i].toScalar() : exponent.toScalar();
      if (in_place) {
        at::Tensor t = self[i];
        t.pow_(e);
      } else {
        results.push_back(at::pow(self[i], e));
      }
    }
  }
  torch::jit::drop(*stack, n);
  if (!in_place) stack->emplace_back(std::move(results));
  return true;
}

namespace {

std::optional<size_t> check_errors_position(const c10::OperatorHandle& op,
                                            const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "check_errors") return begin + i;
  }
  return std::nullopt;
}

}  // namespace

// linalg_inv_ex and linalg_cholesky_ex (and their out= forms) with check_errors=True: their CPU
// kernels raise from inside the stream task, so the error surfaced at the next synchronization.
// CUDA's read the info on the host (_linalg_check_errors) and raise at the call: the call runs
// without the check, in stream order, then the info is checked here, as CUDA does.
bool linalg_ex_check_errors_when(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::optional<size_t> at = check_errors_position(op, stack);
  return at && stack[*at].isBool() && stack[*at].toBool();
}

bool linalg_ex_check_errors(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!linalg_ex_check_errors_when(op, *stack)) return false;
  const size_t begin = stack->size() - op.schema().arguments().size();
  const at::Tensor input = (*stack)[begin].toTensor();
  (*stack)[*check_errors_position(op, *stack)] = false;
  op.callBoxed(stack);
  const at::Tensor info = stack->back().toTensor();  // (result, info)
  const bool inverse = op.schema().name() == "aten::linalg_inv_ex";
  at::_linalg_check_errors(info, inverse ? "linalg.inv_ex" : "linalg.cholesky_ex",
                           input.dim() == 2);
  return true;
}

}  // namespace accel::aten
