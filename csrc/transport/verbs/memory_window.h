// Memory windows: remote write access to a registered region granted for one
// exposure and revoked when it ends (the verbs side of expose()/conceal()).
//
// A user region is registered with local access and IBV_ACCESS_MW_BIND only,
// so its MR's own rkey opens nothing to a peer. expose() binds a type-1
// memory window over the region with remote write; conceal() invalidates it
// (a bind of length 0). Every bind gives the window a new rkey (its low 8
// bits step), so a write meant for an earlier exposure -- a late duplicate
// after a failover, or a peer that kept a key -- is refused by the NIC
// instead of landing in the next operation's data or in memory the user got
// back. Keys repeat only after 256 exposures of the same region.
//
// Type 1, not type 2: a type-2 window is tied to one QP, while a region is
// written through every path's QP and a grant carries one key. A type-1
// window is PD-wide, but binding it is still a send-queue operation: it is
// posted on a QP of the binder's own, connected to itself, with its own CQ
// that the caller polls right there. So binding never depends on a peer's
// paths being up and never goes through the progress thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "transport/verbs/gid_table.h"

namespace maestro {
namespace transport {
namespace verbs {

class Device;

class WindowBinder {
 public:
  // True when `device` offers type-1 memory windows.
  static bool supported(const Device& device);

  // A loopback RC QP on `device`'s PD, brought to RTS towards itself through
  // `gid` (the RoCE v2 GID of a local vNIC address). Throws with the reason.
  WindowBinder(Device* device, const GidEntry& gid);
  ~WindowBinder();
  WindowBinder(const WindowBinder&) = delete;
  WindowBinder& operator=(const WindowBinder&) = delete;

  // Binds `mw` over the whole of `mr` for remote write; returns the
  // window's new rkey once the bind has completed. Throws on failure (the
  // window then stays unbound).
  uint32_t bind(ibv_mw* mw, ibv_mr* mr);
  // Invalidates the window (bound over `mr`): once this returns, no write
  // with any of its keys lands. Throws on failure.
  void unbind(ibv_mw* mw, ibv_mr* mr);

 private:
  void run(ibv_mw* mw, const ibv_mw_bind_info& info, const char* what);  // mu_ held
  void connectToSelf();  // RESET -> INIT -> RTR -> RTS; mu_ held (or constructor)

  Device* const device_;
  const GidEntry gid_;
  std::mutex mu_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  bool broken_ = false;  // a failed bind left the QP in the error state
  uint64_t next_wr_id_ = 1;
};

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
