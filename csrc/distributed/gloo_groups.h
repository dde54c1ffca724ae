// Accel tensors in a process group created with backend "gloo" (or any backend string that
// names no accel backend): accl's backend is added to the group at its first collective on
// accel tensors.
//
// Why this exists: torch 2.11's BackendConfig maps "gloo" to the device types of
// Backend.backend_capability["gloo"] (cpu, cuda) and offers other device types no way in, so
// `init_process_group("gloo")` gives a group whose collectives on accel tensors fail with
// "No backend type associated with device type accel". Upstream: pytorch/pytorch#184010 (open:
// let ProcessGroupGloo take PrivateUse1 tensors) and #100958 (closed unmerged: map a custom
// device in BackendConfig). test_distributed_gloo_group.py's
// test_gloo_alone_still_leaves_accel_out_upstream fails once PyTorch maps accel itself.
//
// How: a BackendSelect kernel for each c10d operator (PyTorch registers none at that key for
// them; every collective of a ProcessGroup goes through these operators). When the call has
// accel tensors and the group no accel backend, it asks the creator (torch_accel.distributed's
// backend creator, on the group's store under the "accel/" prefix PyTorch itself would use) for
// one, registers it with the group, and passes the call on to PyTorch's own kernel.
//
// Not covered: what reaches a group's backend without an operator before that first
// collective (`group._get_backend(torch.device("accel"))`, `init_process_group("gloo",
// device_id=<accel>)`, `batch_isend_irecv`, the coalescing manager) still raises PyTorch's
// error until then. Creating the backend takes every rank of the group, as creating the group
// did: a first accel call that only some ranks make (a send/recv pair in a larger group) waits
// for the others until the group's timeout.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>

namespace accel::distributed {

using GroupBackendCreator = std::function<c10::intrusive_ptr<c10d::Backend>(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout)>;

// Sets the creator (once, from torch_accel.distributed at import). Without one, groups are
// left as PyTorch made them.
void set_group_backend_creator(GroupBackendCreator creator);

}  // namespace accel::distributed
