// torch.distributed's accel backend (torch_accel/distributed): wraps the Gloo backend that
// PyTorch built for the group into accel's backend (csrc/distributed), which runs Gloo's
// collectives on CPU views of accel memory in stream order.
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "distributed/backend.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace accel::python {

void init_distributed_bindings(py::module_& m) {
  m.def(
      "_distributed_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& inner, int rank, int size, bool check) {
        return c10::intrusive_ptr<c10d::Backend>(
            c10::make_intrusive<distributed::AccelBackend>(inner, rank, size, check));
      },
      py::arg("inner"), py::arg("rank"), py::arg("size"), py::arg("check") = true,
      "accel's process-group backend over `inner` (a ProcessGroupGloo of the same group).");
  m.def(
      "_distributed_inner_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* accel = dynamic_cast<distributed::AccelBackend*>(backend.get());
        TORCH_CHECK_VALUE(accel, "not an accel (accl) backend");
        return accel->inner();
      },
      "The backend that moves the bytes for an accl backend.");
}

}  // namespace accel::python
