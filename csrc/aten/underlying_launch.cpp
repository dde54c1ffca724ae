#include "aten/underlying_launch.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "aten/executor.h"
#include "aten/host_task.h"
#include "aten/replay_kernels.h"
#include "aten/results.h"

namespace accel::aten {

bool launch_call(const OpConfig& config, const SchemaInfo& info, const c10::OperatorHandle& op,
                 const torch::jit::Stack& stack, size_t begin, const CachedResult& shapes,
                 c10::DeviceIndex device, c10::SmallVectorImpl<c10::IValue>& results,
                 bool copy_aliased, bool wait) {
  const size_t n = stack.size() - begin;
  const size_t n_returns = info.return_alias.size();
  results.assign(n_returns, c10::IValue());
  c10::SmallVector<Layout, 3> fresh;  // new results, in order
  for (size_t j = 0; j < n_returns; ++j) {
    if (const auto arg = info.return_alias[j]) {
      if (copy_aliased) results[j] = stack[begin + *arg];
      continue;
    }
    if (!shapes.result_is_list[j]) {
      at::Tensor t = allocate(shapes.results[j].front());
      fresh.push_back(Layout::of(t));
      results[j] = std::move(t);
    } else {
      std::vector<at::Tensor> ts;
      for (const TensorMeta& m : shapes.results[j]) {
        ts.push_back(allocate(m));
        fresh.push_back(Layout::of(ts.back()));
      }
      results[j] = std::move(ts);
    }
  }

  Work work{info.kernel(op),
            std::unique_ptr<WorkBuffers, RecycleBuffers>(take_buffers().release())};
  WorkBuffers& buf = *work.buf;
  materialize_written(info, stack, begin);
  if (info.functional_op) {
    // An out= form with several outputs: run the functional form and copy into the outputs
    // (see codegen/gen_accel.py for why it is not called boxed).
    work.op = *info.functional_op;
    for (size_t i = 0; i < n; ++i) {
      if (!info.out_argument[i]) buf.add().stash(stack[begin + i], info.write_argument[i]);
    }
    for (const std::optional<size_t>& arg : info.return_alias) {
      buf.copy_into.push_back(Layout::of(stack[begin + *arg].toTensor()));
    }
  } else {
    for (size_t i = begin; i < stack.size(); ++i) {
      buf.add().stash(stack[i], info.write_argument[i - begin]);
    }
  }
  if (!fresh.empty()) {
    // `into` functions call the CPU's kernels: the host executor's alone.
    if (config.into != nullptr && executor() == Executor::Host) {
      work.into = config.into;  // computes straight into the new tensors
      buf.copy_into.assign(fresh.begin(), fresh.end());
    } else if (info.out_op && !info.cpu_op) {
      work.op = *info.out_op;  // results are written straight into the new tensors
      for (const Layout& l : fresh) {
        Arg& a = buf.add();
        a.kind = Arg::Kind::Tensor;
        a.result = true;
        a.tensor = l;
      }
    } else {
      buf.copy_into.assign(fresh.begin(), fresh.end());
    }
  }
  work.serial = small_work(buf, info.serial);
  if (wait) {
    return run_on_stream(device, config.name, [&] {
      KernelStorages storages;
      work.run_waited(storages);
    });
  }
  std::optional<rt::Task> direct;
  if (executor() == Executor::Host && stream_capturing(device)) {
    direct = replay_elementwise(work);
  }
  if (direct) {
    launch(device, config.name, std::move(*direct));  // replays without ATen
  } else {
    launch_kernel(device, config.name, std::move(work));
  }
  return false;
}

}  // namespace accel::aten
