#include "aten/dispatch_util.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>

#include "aten/executor.h"
#include "aten/meta_cache.h"
#include "device/common.h"
#include "device/generator.h"
#include "device/graph_rng.h"

namespace accel::aten {
namespace {

using device::kAccel;

struct DeviceScan {
  std::optional<c10::DeviceIndex> device;
  std::optional<c10::DeviceIndex> other;  // a second accel device, if any
  bool accel_tensor = false;              // an accel tensor (not just a device argument)
  bool cpu_tensor = false;  // a CPU tensor with dimensions, alone or in a list (not Tensor?[])

  void see(c10::Device d) {
    if (d.type() != kAccel) return;
    const c10::DeviceIndex index = d.has_index() ? d.index() : device::current_device();
    if (!device) {
      device = index;
    } else if (*device != index && !other) {
      other = index;
    }
  }
  // `cpu_ok`: a CPU tensor is accepted here whatever its dimensions (indices, the scalars of
  // _foreach_ operators); `written`: not even a 0-dim CPU tensor is (an out= argument).
  void see(const at::Tensor& t, bool cpu_ok, bool written) {
    if (!t.defined()) return;
    see(t.device());
    accel_tensor = accel_tensor || t.device().type() == kAccel;
    cpu_tensor = cpu_tensor || (!cpu_ok && t.device().is_cpu() && (t.dim() > 0 || written));
  }
  void see(const c10::IValue& v, bool cpu_ok, bool written) {
    if (v.isTensor()) {
      see(v.toTensor(), cpu_ok, written);
    } else if (v.isTensorList()) {  // cat, stack, _foreach_
      for (const at::Tensor& t : v.toTensorList()) see(t, cpu_ok, written);
    } else if (v.isList()) {  // Tensor?[]: indices, which CUDA takes on the CPU too
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) see(e.toTensor(), /*cpu_ok=*/true, written);
      }
    } else if (v.isDevice()) {
      see(v.toDevice());
    }
  }
};

}  // namespace

std::string op_name(const c10::OperatorHandle& op) {
  const c10::OperatorName& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

c10::DeviceIndex call_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                             std::string_view name) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  // _foreach_ operators take their `scalars` as a CPU tensor (_foreach_addcdiv_.Tensor).
  const bool foreach = name.starts_with("aten::_foreach_");
  // index_fill takes its index on the CPU too, as CUDA does (the call uploads it).
  const bool index_fill = name.starts_with("aten::index_fill");
  DeviceScan scan;
  bool accel_generator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    const c10::AliasInfo* alias = args[i].alias_info();
    const bool cpu_ok =
        (foreach && args[i].name() == "scalars") || (index_fill && args[i].name() == "index");
    scan.see(v, cpu_ok, alias != nullptr && alias->isWrite());
    if (v.isGenerator() && device::is_accel_generator(v.toGenerator())) accel_generator = true;
  }
  TORCH_CHECK(!scan.other,
              "Expected all tensors to be on the same device, but found at least two devices, "
              "accel:",
              static_cast<int>(*scan.device), " and accel:", static_cast<int>(*scan.other),
              "! (when running ", name, ")");
  TORCH_CHECK(!scan.cpu_tensor || !scan.accel_tensor,
              "Expected all tensors to be on the same device, but found at least two devices, "
              "accel:",
              static_cast<int>(*scan.device), " and cpu! (when running ", name,
              "; CPU tensors combine with accel tensors only as 0-dim scalar inputs)");
  TORCH_CHECK(scan.device || !accel_generator, name,
              ": an accel generator was given but no tensor is on accel; use a generator of the "
              "tensors' device");
  return scan.device ? *scan.device : device::current_device();
}

bool foreach_lists_span_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  std::optional<c10::Device> device;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    if (!v.isTensorList() || args[i].name() == "scalars") continue;
    const c10::AliasInfo* alias = args[i].alias_info();
    const bool written = alias != nullptr && alias->isWrite();
    for (const at::Tensor& t : v.toTensorList()) {
      if (!t.defined() || (t.device().is_cpu() && t.dim() == 0 && !written)) continue;
      if (!device) {
        device = t.device();
      } else if (t.device() != *device) {
        return true;
      }
    }
  }
  return false;
}

bool is_generator_argument(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  return t->kind() == c10::TypeKind::OptionalType &&
         t->containedType(0)->kind() == c10::TypeKind::GeneratorType;
}

namespace {

// Replaces each generator argument of the call by substitute(its accel generator): a given one
// (checked to be accel's, in the words of CUDA's check_generator), or for an absent one the
// default generator of `device` (random operators draw from it).
template <class F>
void replace_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::DeviceIndex device, F&& substitute) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (!is_generator_argument(args[i])) continue;
    c10::IValue& v = (*stack)[begin + i];
    if (v.isGenerator()) {
      const at::Generator& g = v.toGenerator();
      TORCH_CHECK(device::is_accel_generator(g),
                  "Expected a 'accel' device type for generator "
                  "but found '",
                  c10::DeviceTypeName(g.device().type(), /*lower_case=*/true), "' (when running ",
                  op_name(op), ")");
      v = c10::IValue(substitute(g));
    } else if (v.isNone()) {
      v = c10::IValue(substitute(device::default_generator(device)));
    }
  }
}

}  // namespace

void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           c10::DeviceIndex device) {
  // During a graph capture the generators' draws are numbered per replay (graph_rng.h).
  const rt::Stream stream = device::call([&] { return rt::current_stream(device); });
  const uint64_t capture = device::call([&] { return rt::stream_capture_id(stream); });
  replace_generators(op, stack, device, [&](const at::Generator& g) {
    if (capture == 0) return device::next_cpu_generator(g);
    return device::captured_cpu_generator(g, stream, capture, op_name(op).c_str());
  });
}

std::vector<std::unique_ptr<device::CudaDraw>> substitute_kernel_generators(
    const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  std::vector<std::unique_ptr<device::CudaDraw>> draws;
  if (executor() != Executor::Cuda) {
    substitute_generators(op, stack, device);
    return draws;
  }
  // During a graph capture the graph's CUDA generators number the draws per replay.
  const rt::Stream stream = device::call([&] { return rt::current_stream(device); });
  const uint64_t capture = device::call([&] { return rt::stream_capture_id(stream); });
  replace_generators(op, stack, device, [&](const at::Generator& g) {
    if (capture != 0) {
      return device::captured_cuda_generator(g, stream, capture, op_name(op).c_str(),
                                             &make_captured_cuda_rng);
    }
    draws.push_back(std::make_unique<device::CudaDraw>(g, device));
    return draws.back()->cuda_generator();
  });
  return draws;
}

bool returns_view(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    if (r.alias_info() != nullptr && !r.alias_info()->isWrite()) return true;
  }
  return false;
}

void upload_cpu_indices(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::DeviceIndex device) {
  const auto on_cpu = [](const c10::IValue& e) {
    return e.isTensor() && e.toTensor().defined() && e.toTensor().device().is_cpu();
  };
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  for (size_t i = begin; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && on_cpu(v) && args[i - begin].name() == "index") {  // index_fill
      v = v.toTensor().to(c10::Device(kAccel, device));
      continue;
    }
    if (!is_optional_tensor_list(v)) continue;
    const c10::ArrayRef<c10::IValue> elems = v.toListRef();
    if (std::none_of(elems.begin(), elems.end(), on_cpu)) continue;
    c10::List<std::optional<at::Tensor>> uploaded;
    for (const c10::IValue& e : elems) {
      if (on_cpu(e)) {
        uploaded.push_back(e.toTensor().to(c10::Device(kAccel, device)));
      } else {
        uploaded.push_back(e.isNone() ? std::nullopt : std::optional<at::Tensor>(e.toTensor()));
      }
    }
    v = std::move(uploaded);
  }
}

bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const auto kind = r.type()->kind();
    if (kind == c10::TypeKind::TensorType) continue;
    if (kind == c10::TypeKind::ListType &&
        r.type()->containedType(0)->kind() == c10::TypeKind::TensorType) {
      continue;
    }
    return false;
  }
  return true;
}

std::optional<size_t> aliased_argument(const c10::FunctionSchema& schema,
                                       const c10::Argument& result) {
  const c10::AliasInfo* alias = result.alias_info();
  if (alias == nullptr || !alias->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a == nullptr) continue;
    for (const auto& set : alias->beforeSets()) {
      if (a->beforeSets().count(set) != 0) return i;
    }
  }
  return std::nullopt;
}

}  // namespace accel::aten
