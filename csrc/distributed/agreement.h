// Checking that every rank called the same collective on matching tensors before the bytes
// move: Gloo aborts the process when a peer's message has an unexpected size (a shape or dtype
// mismatch across ranks), so accl compares a small signature of each collective first, through
// one small exchange of messages, and raises the same ValueError on every rank instead.
// ACCEL_DIST_CHECK=0 turns it off (one round trip less per collective).
//
// A small all_reduce (at most kInlineBytes of one tensor) travels inside the agreement message
// itself: every rank then reduces the gathered copies locally, in rank order (the same result
// on every rank), and the collective costs one round trip, as Gloo's own would.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace accel::distributed {

struct Signature {
  int64_t reduce_op = -1;  // c10d::ReduceOp::RedOpType, where the collective reduces
  int64_t root = -1;       // broadcast, reduce, gather, scatter
  int64_t dtype = -1;      // c10::ScalarType of the first tensor
  int64_t elements = 0;    // what each rank contributes, in elements (equal on every rank)
  // all_to_all: the elements this rank sends to and receives from each rank (pairwise equal).
  std::vector<int64_t> send;
  std::vector<int64_t> recv;
  // all_reduce done by the agreement (see can_inline): the tensor's CPU view, read before the
  // exchange and overwritten with the reduction after it.
  at::Tensor inline_tensor;
};

constexpr int64_t kInlineBytes = 4096;

// Whether an all_reduce of `t` (one tensor) with `reduce_op` can travel inside the agreement.
bool can_inline(const at::Tensor& t, int64_t reduce_op);

// Exchanges the signature of `op` with every rank through `inner` (blocking) and throws
// c10::ValueError, naming each rank's call, unless they agree. With sig.inline_tensor, also
// completes the all_reduce (the tensor then holds the result).
void agree(c10d::Backend& inner, c10d::OpType op, const Signature& sig, const std::string& name);

}  // namespace accel::distributed
