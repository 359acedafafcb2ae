// Barrier: the operation handshake (every rank's left neighbour learns it
// entered), then a dissemination barrier: in round k every rank tells rank
// r + 2^k and waits for rank r - 2^k, so after ceil(log2 n) rounds every rank
// has transitively heard from every other.
#include "collectives/collectives.h"
#include "common/error.h"

namespace maestro {
namespace collectives {

void barrier(multipath::Engine& engine, uint64_t seq, Deadline deadline) {
  OpDesc desc;
  desc.kind = static_cast<uint8_t>(OpKind::kBarrier);
  OpContext ctx(engine, seq, desc, deadline);
  const int n = engine.size(), r = engine.rank();
  if (n == 1) return;
  ctx.handshake({});
  for (uint32_t round = 0, dist = 1; dist < static_cast<uint32_t>(n); ++round, dist *= 2) {
    int to = static_cast<int>((r + dist) % n);
    int from = static_cast<int>((r + n - dist % n) % n);
    try {
      engine.sendControl(to, multipath::ControlType::kBarrier, seq, round);
    } catch (const Error& e) {
      ctx.abort(e.what());
    }
    ctx.run([&] { return engine.takeControl(from, {multipath::ControlType::kBarrier, seq, round}, nullptr); },
            [&] { return strcat("rank ", from, " to reach the barrier (round ", round, ")"); },
            [&] { return std::vector<int>{from}; });
  }
}

}  // namespace collectives
}  // namespace maestro
