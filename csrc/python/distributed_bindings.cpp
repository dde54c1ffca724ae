// torch.distributed's accel backend (torch_accel/distributed): wraps the backend built for the
// group (Gloo on the host driver, NCCL on the cuda driver) into accel's backend
// (csrc/distributed), which runs its collectives on views of accel memory in stream order.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "distributed/backend.h"
#include "distributed/gloo_groups.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace accel::python {

void init_distributed_bindings(py::module_& m) {
  m.def(
      "_distributed_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& inner,
         const std::optional<c10::intrusive_ptr<c10d::Backend>>& checker, int rank, int size) {
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<distributed::AccelBackend>(
            inner, checker.value_or(nullptr), rank, size));
      },
      py::arg("inner"), py::arg("checker"), py::arg("rank"), py::arg("size"),
      "accel's process-group backend over `inner` (ProcessGroupGloo on the host driver, "
      "ProcessGroupNCCL on the cuda driver), comparing each collective across ranks through "
      "`checker` (a ProcessGroupGloo of the same group) unless it is None.");
  m.def(
      "_distributed_inner_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* accel = dynamic_cast<distributed::AccelBackend*>(backend.get());
        TORCH_CHECK_VALUE(accel, "not an accel (accl) backend");
        return accel->inner();
      },
      py::arg("backend"), "The backend that moves the bytes for an accl backend.");
  m.def(
      "_distributed_set_group_backend_creator",
      [](py::object create) {
        // Kept until exit: collectives may run until the interpreter is gone.
        auto* held = new py::object(std::move(create));
        distributed::set_group_backend_creator([held](c10::intrusive_ptr<c10d::Store> store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout) {
          py::gil_scoped_acquire gil;
          return (*held)(std::move(store), rank, size, timeout)
              .cast<c10::intrusive_ptr<c10d::Backend>>();
        });
      },
      py::arg("create"),
      "Sets the creator called with (store, rank, size, timeout) for the accel backend of a "
      "process group created without one, at its first collective on accel tensors.");
}

}  // namespace accel::python
