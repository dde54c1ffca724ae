#include "distributed/gloo_groups.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mutex>
#include <utility>

namespace accel::distributed {
namespace {

std::mutex& mutex() {
  static std::mutex mu;
  return mu;
}

GroupBackendCreator& creator() {
  static GroupBackendCreator* c = new GroupBackendCreator();  // never destroyed: may hold Python
  return *c;
}

bool has_accel_backend(c10d::ProcessGroup& pg) {
  try {
    pg.getBackend(c10::DeviceType::PrivateUse1);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

std::chrono::milliseconds group_timeout(c10d::ProcessGroup& pg) {
  try {
    return pg.getDefaultBackend()->getBackendOptions()->timeout;
  } catch (const c10::Error&) {
    return ::kBackendDefaultTimeout;
  }
}

void add_accel_backend(c10d::ProcessGroup& pg, const char* op_name) {
  std::lock_guard<std::mutex> lock(mutex());
  if (has_accel_backend(pg) || !creator()) return;
  bool custom_taken = true;
  try {
    pg.getBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  } catch (const c10::Error&) {
    custom_taken = false;
  }
  TORCH_CHECK_VALUE(!custom_taken, "accl: ", op_name, " got accel tensors in process group '",
                    pg.getGroupDesc(), "', which has no backend for accel and already holds a ",
                    "custom backend for another device; name accl for accel when creating the ",
                    "group (backend=\"cpu:gloo,accel:accl\")");
  // The prefix PyTorch gives each device's backend of a group (distributed_c10d.py).
  auto store = c10::make_intrusive<c10d::PrefixStore>("accel/", pg.getStore());
  auto backend = creator()(store, pg.getRank(), pg.getSize(), group_timeout(pg));
  TORCH_CHECK(backend, "accl: the backend creator returned nothing");
  backend->setGroupUid(pg.getGroupName());
  backend->setGroupDesc(pg.getGroupDesc());
  pg.setBackend(c10::DeviceType::PrivateUse1, c10d::ProcessGroup::BackendType::CUSTOM, backend);
}

// torch 2.11 makes GLOO the default backend type of a group created without a backend string
// (`init_process_group()`) unless NCCL is among its backends, also when accl's (CUSTOM) is the
// only one registered: whatever asks a group for its default backend (DDP's constructor, the
// sequence numbers) then fails with "Could not find backend type 1 for Process Group with name
// gloo". accl becomes the default of such a group at its first collective on accel tensors
// (DDP's constructor runs collectives before it asks). Upstream: pytorch/pytorch#189193 (after
// 2.11, for the same failure on XPU's xccl) picks the default among the registered backends;
// test_distributed_training.py's test_ddp_trains_over_a_plain_init_process_group fails once
// torch picks it itself.
void default_to_accel_backend(c10d::ProcessGroup& pg) {
  std::lock_guard<std::mutex> lock(mutex());
  const auto type = pg.getBackendType();
  if (type == c10d::ProcessGroup::BackendType::CUSTOM) return;
  try {
    pg.getBackend(type);
    return;  // the default is registered: leave it
  } catch (const c10::Error&) {
  }
  try {
    if (pg.getBackend(c10::DeviceType::PrivateUse1) !=
        pg.getBackend(c10d::ProcessGroup::BackendType::CUSTOM))
      return;  // accel's backend is not the group's CUSTOM one
  } catch (const c10::Error&) {
    return;
  }
  pg.setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
}

void add_backend_then_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  if (keys.has_backend(c10::BackendComponent::PrivateUse1Bit)) {
    const auto& args = op.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].name() != "process_group") continue;
      const c10::IValue& group = (*stack)[stack->size() - args.size() + i];
      auto pg = group.toCustomClass<c10d::ProcessGroup>();
      if (!has_accel_backend(*pg)) add_accel_backend(*pg, op.schema().name().c_str());
      default_to_accel_backend(*pg);
    }
  }
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
      stack);
}

// Every c10d operator that takes a process group and tensors (torch/csrc/distributed/c10d/
// Ops.cpp in 2.11).
TORCH_LIBRARY_IMPL(c10d, BackendSelect, m) {
  for (const char* name : {"broadcast_",
                           "allreduce_",
                           "allreduce_coalesced_",
                           "allgather_",
                           "_allgather_base_",
                           "allgather_coalesced_",
                           "allgather_into_tensor_coalesced_",
                           "reduce_scatter_",
                           "_reduce_scatter_base_",
                           "reduce_scatter_tensor_coalesced_",
                           "reduce_",
                           "gather_",
                           "scatter_",
                           "alltoall_",
                           "alltoall_base_",
                           "barrier",
                           "monitored_barrier_",
                           "send",
                           "recv_",
                           "recv_any_source_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&add_backend_then_call>());
  }
}

}  // namespace

void set_group_backend_creator(GroupBackendCreator c) {
  std::lock_guard<std::mutex> lock(mutex());
  creator() = std::move(c);
}

}  // namespace accel::distributed
