// all_to_all on lists of tensors, which Gloo lacks: one send and one receive per peer (Gloo's
// point-to-point operations, posted without waiting, so no pair of ranks can block each other),
// the rank's own block copied locally. The agreement check (agreement.h) has compared every
// pair's element counts first.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

namespace accel::distributed {

// The tag of all_to_all's messages (point-to-point tags are the user's otherwise: one that
// uses this tag concurrently would mix its messages with all_to_all's).
constexpr int kAllToAllTag = 0x7a11a11;

// Posts the exchange of `inputs[j]` to rank j into `outputs[j]` from rank j (CPU views, one
// dtype) and returns a work that completes when every message did.
c10::intrusive_ptr<c10d::Work> all_to_all_p2p(c10d::Backend& inner,
                                              std::vector<at::Tensor>& outputs,
                                              std::vector<at::Tensor>& inputs);

}  // namespace accel::distributed
