#include "distributed/backend.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "aten/executor.h"
#include "aten/host_task.h"
#include "device/common.h"
#include "distributed/agreement.h"
#include "distributed/all_to_all.h"
#include "distributed/stream_call.h"
#include "distributed/work.h"

namespace accel::distributed {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// Runs jobs one at a time, in the order they came, on a thread of its own (started with the
// first), or on the caller's thread when nothing is queued or running (run_now). A job is told
// whether it is cancelled: the backend shut down before it ran.
class CommThread {
 public:
  using Job = std::function<void(bool cancelled)>;

  ~CommThread() { stop(); }

  void push(Job job) {
    std::lock_guard<std::mutex> lock(mu_);
    check_open();
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }

  // Runs `job` now on this thread if no other job is queued or running (the order stays the
  // call order); false if it has to be pushed instead.
  bool run_now(const Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open();
      if (running_ || !jobs_.empty()) return false;
      running_ = true;
    }
    job(false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
    return true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void check_open() {
    TORCH_CHECK_WITH(DistBackendError, !stopped_,
                     "accl: the process group was shut down; create a new one");
  }

  void loop() {
    for (;;) {
      Job job;
      bool cancelled = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return (stopped_ || !jobs_.empty()) && !running_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        cancelled = stopped_;
        running_ = true;
      }
      job(cancelled);
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_ = false;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool running_ = false;  // a job runs (here or on a caller's thread)
  bool stopped_ = false;
  std::thread thread_;
};

// One collective: the accel tensors it touches, the views the inner backend gets (CPU tensors
// on the host driver, CUDA tensors on the cuda driver), and the call that hands them over.
struct AccelBackend::Call {
  Call(const char* op_name, c10d::OpType op) : op_name(op_name), op(op) {}

  // The view of an accel tensor that the collective reads (`write` false) or writes.
  at::Tensor view(const at::Tensor& t, bool write) {
    TORCH_CHECK_VALUE(t.defined(), "accl: ", op_name, " got an undefined tensor");
    TORCH_CHECK_VALUE(t.device().type() == device::kAccel, "accl: ", op_name, " got a tensor on ",
                      t.device(),
                      "; the accel backend takes accel tensors only (move it with .to('accel'))");
    if (device < 0) {
      device = t.device().index();
    } else {
      TORCH_CHECK_VALUE(t.device().index() == device, "accl: ", op_name,
                        " got tensors on accel:", int(device), " and ", t.device(),
                        "; a collective runs on one device per rank");
    }
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "accl: ", op_name, " got a ", t.layout(),
                      " tensor; only dense tensors are supported");
    TORCH_CHECK_VALUE(t.is_contiguous(t.suggest_memory_format()), "accl: ", op_name,
                      " needs contiguous tensors, got one of sizes ", t.sizes(), " and strides ",
                      t.strides(), " (call .contiguous() first)");
    if (keep.empty()) sig.dtype = static_cast<int64_t>(t.scalar_type());
    keep.push_back(t);
    if (write) outputs.push_back(t);
    auto layout = aten::Layout::of(t, write);
    memory.emplace_back(layout.base, layout.nbytes);
    return layout.view_on(aten::kernel_device(device));
  }
  std::vector<at::Tensor> views(const std::vector<at::Tensor>& ts, bool write) {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back(view(t, write));
    return out;
  }
  std::vector<std::vector<at::Tensor>> views(const std::vector<std::vector<at::Tensor>>& ls,
                                             bool write) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(ls.size());
    for (const auto& l : ls) out.push_back(views(l, write));
    return out;
  }

  // What every rank must agree on (checked before the collective when the backend checks).
  int64_t elements(const std::vector<at::Tensor>& ts) {
    int64_t n = 0;
    for (const auto& t : ts) n += t.numel();
    return n;
  }

  const char* op_name;
  c10d::OpType op;
  Signature sig;
  c10::DeviceIndex device = -1;  // -1: no tensors (barrier)
  std::vector<at::Tensor> keep;
  std::vector<at::Tensor> outputs;
  std::vector<std::pair<const void*, size_t>> memory;  // the storages the views cover
  std::function<WorkPtr()> issue;
};

namespace {

// The inner work of a collective the agreement completed (a small all_reduce).
class DoneWork final : public c10d::Work {
 public:
  DoneWork() { finish(); }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
    f->markCompleted();
    return f;
  }
};

// The elements all_to_all_single moves to (or from) each rank: rows of dim 0, split as given or
// evenly.
std::vector<int64_t> split_elements(const at::Tensor& t, const std::vector<int64_t>& splits,
                                    int size) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  const int64_t row = rows > 0 ? t.numel() / rows : 0;
  std::vector<int64_t> out;
  for (int j = 0; j < size; ++j) {
    out.push_back(splits.empty() ? t.numel() / size : splits.at(j) * row);
  }
  return out;
}

}  // namespace

AccelBackend::AccelBackend(c10::intrusive_ptr<c10d::Backend> inner,
                           c10::intrusive_ptr<c10d::Backend> checker, int rank, int size)
    : c10d::Backend(rank, size),
      inner_(std::move(inner)),
      checker_(std::move(checker)),
      on_host_(aten::executor() == aten::Executor::Host),
      thread_(std::make_unique<CommThread>()) {
  TORCH_CHECK(inner_, "accl: no inner backend");
  if (!on_host_ && aten::executor() != aten::Executor::Cuda) {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "torch.distributed on accel (backend accl) needs the host or the "
                                "cuda driver: ",
                                aten::executor_unavailable_reason());
  }
}

AccelBackend::~AccelBackend() {
  thread_->stop();
}

void AccelBackend::abort() {
  thread_->stop();
  inner_->abort();
}

void AccelBackend::shutdown() {
  thread_->stop();
  inner_->shutdown();
}

void AccelBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "accl: startCoalescing() called twice without endCoalescing()");
  coalescing_ = true;
  coalesced_.clear();
}

WorkPtr AccelBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "accl: endCoalescing() without startCoalescing()");
  coalescing_ = false;
  std::vector<std::shared_ptr<CallState>> calls;
  for (auto& w : coalesced_) {
    auto* work = static_cast<AccelWork*>(w.get());
    auto part = work->calls();
    calls.insert(calls.end(), part.begin(), part.end());
  }
  coalesced_.clear();
  return c10::make_intrusive<AccelWork>(getRank(), c10d::OpType::COALESCED, std::move(calls));
}

WorkPtr AccelBackend::track(WorkPtr work) {
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

WorkPtr AccelBackend::submit(Call call) {
  const c10::DeviceIndex dev = call.device >= 0 ? call.device : device::current_device();
  aten::refuse_capture(dev, call.op_name,
                       on_host_ ? "collectives run through Gloo on the host, outside the device's "
                                  "streams"
                                : "accel graphs do not record NCCL's streams");
  std::string name = std::string(call.op_name) + " on accel:" + std::to_string(int(dev));
  // Point-to-point messages are not compared: only the two ranks involved take part.
  const bool check = checker_ && call.op != c10d::OpType::SEND && call.op != c10d::OpType::RECV &&
                     call.op != c10d::OpType::RECVANYSOURCE;
  if (!on_host_) return submit_in_stream_order(std::move(call), dev, name, check);
  std::vector<c10::Device> devices;
  if (call.device >= 0) devices.emplace_back(device::kAccel, call.device);
  auto state = std::make_shared<HostCallState>(std::move(name), std::move(call.keep),
                                               std::move(call.outputs), std::move(devices));
  // The collective starts once the caller's stream reached this point: at once when that stream
  // is idle (and no collective waits before it), else after an event recorded on it.
  const rt::Stream stream = device::call([&] { return rt::current_stream(dev); });
  const bool idle = device::call([&] { return rt::stream_query(stream); });
  auto job = [state, check, inner = inner_, checker = checker_, op = call.op,
              sig = std::move(call.sig), memory = std::move(call.memory),
              issue = std::move(call.issue)](bool cancelled, rt::Event ready) {
    c10::intrusive_ptr<c10d::Work> work;
    std::exception_ptr error;
    HostCallState::Access access;
    try {
      TORCH_CHECK_WITH(DistBackendError, !cancelled,
                       "the process group was shut down before it started");
      if (ready) device::call([&] { rt::event_synchronize(ready); });
      device::call([&] {
        for (const auto& [base, nbytes] : memory) {
          access.push_back(std::make_unique<rt::HostAccessGuard>(base, nbytes));
        }
      });
      if (check) agree(*checker, op, sig, state->name);
      work = sig.inline_tensor.defined() ? WorkPtr(c10::make_intrusive<DoneWork>()) : issue();
    } catch (...) {
      error = std::current_exception();
    }
    try {
      if (ready) rt::event_destroy(ready);
    } catch (...) {
    }
    state->issued(std::move(work), error, std::move(access));
  };
  if (!idle || !thread_->run_now([&](bool cancelled) { job(cancelled, rt::Event{}); })) {
    rt::Event ready = device::call([&] {
      rt::Event e = rt::event_create(dev);
      rt::event_record(e, stream);
      return e;
    });
    thread_->push([job = std::move(job), ready](bool cancelled) { job(cancelled, ready); });
  }
  return track(c10::make_intrusive<AccelWork>(getRank(), call.op,
                                              std::vector<std::shared_ptr<CallState>>{state}));
}

WorkPtr AccelBackend::submit_in_stream_order(Call call, c10::DeviceIndex dev,
                                             const std::string& name, bool check) {
  if (check) agree(*checker_, call.op, call.sig, name);
  auto state =
      std::make_shared<StreamCallState>(name, std::move(call.keep), std::move(call.outputs), dev);
  WorkPtr inner;
  try {
    aten::KernelScope scope(dev);  // accel's stream is the current CUDA stream
    inner = call.issue();
  } catch (...) {
    rethrow_naming(std::current_exception(), name);
  }
  state->issued(std::move(inner));
  return track(c10::make_intrusive<AccelWork>(getRank(), call.op,
                                              std::vector<std::shared_ptr<CallState>>{state}));
}

// Each collective: views of its tensors, then the inner backend's collective on them.

WorkPtr AccelBackend::broadcast(std::vector<at::Tensor>& tensors,
                                const c10d::BroadcastOptions& opts) {
  Call call("broadcast", c10d::OpType::BROADCAST);
  auto v = call.views(tensors, true);
  call.sig.root = opts.rootRank;
  call.sig.elements = call.elements(tensors);
  call.issue = [inner = inner_, v, opts]() mutable { return inner->broadcast(v, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::allreduce(std::vector<at::Tensor>& tensors,
                                const c10d::AllreduceOptions& opts) {
  Call call("allreduce", c10d::OpType::ALLREDUCE);
  auto v = call.views(tensors, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.elements = call.elements(tensors);
  if (on_host_ && checker_ && v.size() == 1 && can_inline(v[0], call.sig.reduce_op)) {
    call.sig.inline_tensor = v[0];  // done by the agreement itself: one round trip
  }
  call.issue = [inner = inner_, v, opts]() mutable { return inner->allreduce(v, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceCoalescedOptions& opts) {
  Call call("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED);
  auto v = call.views(tensors, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.elements = call.elements(tensors);
  call.issue = [inner = inner_, v, opts]() mutable { return inner->allreduce_coalesced(v, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Call call("reduce", c10d::OpType::REDUCE);
  auto v = call.views(tensors, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.root = opts.rootRank;
  call.sig.elements = call.elements(tensors);
  call.issue = [inner = inner_, v, opts]() mutable { return inner->reduce(v, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                std::vector<at::Tensor>& inputs,
                                const c10d::AllgatherOptions& opts) {
  Call call("allgather", c10d::OpType::ALLGATHER);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.elements = call.elements(inputs);
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->allgather(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                      const c10d::AllgatherOptions& opts) {
  Call call("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE);
  auto in = call.view(input, false);
  auto out = call.view(output, true);
  call.sig.elements = input.numel();
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->_allgather_base(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) {
  Call call("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.elements = call.elements(inputs);
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->allgather_coalesced(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  Call call("allgather_into_tensor_coalesced", c10d::OpType::COALESCED);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.elements = call.elements(inputs);
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->allgather_into_tensor_coalesced(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  Call call("gather", c10d::OpType::GATHER);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.root = opts.rootRank;
  call.sig.elements = call.elements(inputs);
  call.issue = [inner = inner_, out, in, opts]() mutable { return inner->gather(out, in, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::scatter(std::vector<at::Tensor>& outputs,
                              std::vector<std::vector<at::Tensor>>& inputs,
                              const c10d::ScatterOptions& opts) {
  Call call("scatter", c10d::OpType::SCATTER);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.root = opts.rootRank;
  call.sig.elements = call.elements(outputs);
  call.issue = [inner = inner_, out, in, opts]() mutable { return inner->scatter(out, in, opts); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                     std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter", c10d::OpType::REDUCE_SCATTER);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.elements = call.elements(outputs);
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->reduce_scatter(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE);
  auto in = call.view(input, false);
  auto out = call.view(output, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.elements = output.numel();
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->_reduce_scatter_base(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) {
  Call call("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED);
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  call.sig.reduce_op = opts.reduceOp.op_;
  call.sig.elements = call.elements(outputs);
  call.issue = [inner = inner_, out, in, opts]() mutable {
    return inner->reduce_scatter_tensor_coalesced(out, in, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                    std::vector<int64_t>& output_splits,
                                    std::vector<int64_t>& input_splits,
                                    const c10d::AllToAllOptions& opts) {
  Call call("all_to_all_single", c10d::OpType::ALLTOALL_BASE);
  auto in = call.view(input, false);
  auto out = call.view(output, true);
  call.sig.send = split_elements(input, input_splits, getSize());
  call.sig.recv = split_elements(output, output_splits, getSize());
  call.issue = [inner = inner_, out, in, output_splits, input_splits, opts]() mutable {
    return inner->alltoall_base(out, in, output_splits, input_splits, opts);
  };
  return submit(std::move(call));
}

WorkPtr AccelBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                               const c10d::AllToAllOptions& opts) {
  // Gloo has no alltoall: point-to-point messages on the host (all_to_all.h); NCCL has one.
  Call call("all_to_all", c10d::OpType::ALLTOALL);
  const auto size = static_cast<size_t>(getSize());
  TORCH_CHECK_VALUE(outputs.size() == size && inputs.size() == size,
                    "accl: all_to_all takes one input and one output tensor per rank (", size,
                    "), got ", inputs.size(), " inputs and ", outputs.size(), " outputs");
  auto in = call.views(inputs, false);
  auto out = call.views(outputs, true);
  for (size_t j = 0; j < size; ++j) {
    TORCH_CHECK_VALUE(
        in[j].scalar_type() == in[0].scalar_type() && out[j].scalar_type() == in[0].scalar_type(),
        "accl: all_to_all needs one dtype for every tensor, got ", in[j].scalar_type(), " and ",
        out[j].scalar_type(), " beside ", in[0].scalar_type());
    call.sig.send.push_back(in[j].numel());
    call.sig.recv.push_back(out[j].numel());
  }
  TORCH_CHECK_VALUE(in[getRank()].numel() == out[getRank()].numel(),
                    "accl: all_to_all: this "
                    "rank's own block has ",
                    in[getRank()].numel(), " elements in and ", out[getRank()].numel(), " out");
  if (on_host_) {
    call.issue = [inner = inner_, out, in]() mutable { return all_to_all_p2p(*inner, out, in); };
  } else {
    call.issue = [inner = inner_, out, in, opts]() mutable {
      return inner->alltoall(out, in, opts);
    };
  }
  return submit(std::move(call));
}

WorkPtr AccelBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  Call call("send", c10d::OpType::SEND);
  auto v = call.views(tensors, false);
  call.issue = [inner = inner_, v, dst, tag]() mutable { return inner->send(v, dst, tag); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  Call call("recv", c10d::OpType::RECV);
  auto v = call.views(tensors, true);
  call.issue = [inner = inner_, v, src, tag]() mutable { return inner->recv(v, src, tag); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call("recv", c10d::OpType::RECVANYSOURCE);
  auto v = call.views(tensors, true);
  call.issue = [inner = inner_, v, tag]() mutable { return inner->recvAnysource(v, tag); };
  return submit(std::move(call));
}

WorkPtr AccelBackend::barrier(const c10d::BarrierOptions& opts) {
  Call call("barrier", c10d::OpType::BARRIER);
  if (opts.device && opts.device->type() == device::kAccel) {
    call.device = device::resolve_device(opts.device->index());
  }
  c10d::BarrierOptions inner_opts = opts;
  // Gloo's barrier has no tensor; NCCL's all_reduces one on the device.
  inner_opts.device = aten::kernel_device(call.device >= 0 ? call.device : -1);
  call.issue = [inner = inner_, inner_opts]() { return inner->barrier(inner_opts); };
  return submit(std::move(call));
}

void AccelBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  barrier(opts)->wait();
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace accel::distributed
