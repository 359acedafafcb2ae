// Direct exchange: every rank writes blocks straight into other ranks'
// buffers (one-sided, chunked over every path to that peer), after a
// handshake with every rank (OpContext::handshakeAll). The algorithm of
// all-to-all; gather and scatter are the exchanges in which only the root
// receives or only the root sends.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/op.h"
#include "collectives/reduce.h"

namespace maestro {
namespace collectives {

// One rank's part, indexed by rank. send[p]: the send_bytes[p] bytes this
// rank writes into rank p; recv[p]: where the recv_bytes[p] bytes from rank p
// land (exposed to p). The entries for this rank itself are copied locally
// (send_bytes[rank] must equal recv_bytes[rank]). Windows with 0 bytes may
// be empty.
struct ExchangePlan {
  std::vector<Window> send;
  std::vector<uint64_t> send_bytes;
  std::vector<Window> recv;
  std::vector<uint64_t> recv_bytes;
  explicit ExchangePlan(int n) : send(n), send_bytes(n, 0), recv(n), recv_bytes(n, 0) {}
};

void exchange(OpContext& ctx, const ExchangePlan& plan);

// Reduce of a small tensor: every rank writes it straight into a slot of the
// root's scratch buffer (a gather), and the root reduces the slots into its
// tensor in rank order. One step instead of the ring's 2(n-1); the root takes
// in n-1 tensors, which is cheap only while they are small (the tuner
// chooses it, tuner.h).
void reduceDirect(OpContext& ctx, const Window& tensor, uint64_t count, DType dtype, ReduceOp op, int root);

}  // namespace collectives
}  // namespace maestro
