#include "distributed/all_to_all.h"

#include <c10/util/Exception.h>

#include <utility>

namespace accel::distributed {
namespace {

// Several works as one: waits for all; completed when all are.
class WorkGroup final : public c10d::Work {
 public:
  explicit WorkGroup(std::vector<c10::intrusive_ptr<c10d::Work>> parts)
      : parts_(std::move(parts)) {}

  bool isCompleted() override {
    for (auto& p : parts_) {
      if (!p->isCompleted()) return false;
    }
    return true;
  }
  std::exception_ptr exception() const override {
    for (const auto& p : parts_) {
      if (auto e = p->exception()) return e;
    }
    return nullptr;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& p : parts_) p->wait(timeout);
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> all_to_all_p2p(c10d::Backend& inner,
                                              std::vector<at::Tensor>& outputs,
                                              std::vector<at::Tensor>& inputs) {
  const int rank = inner.getRank();
  const int size = inner.getSize();
  outputs[rank].view(-1).copy_(inputs[rank].view(-1));  // contiguous, same element count
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  // Sends first, to every peer, then the receives: Gloo's sends return at once.
  for (int j = 0; j < size; ++j) {
    if (j == rank || inputs[j].numel() == 0) continue;
    std::vector<at::Tensor> message{inputs[j]};
    parts.push_back(inner.send(message, j, kAllToAllTag));
  }
  for (int j = 0; j < size; ++j) {
    if (j == rank || outputs[j].numel() == 0) continue;
    std::vector<at::Tensor> message{outputs[j]};
    parts.push_back(inner.recv(message, j, kAllToAllTag));
  }
  return c10::make_intrusive<WorkGroup>(std::move(parts));
}

}  // namespace accel::distributed
