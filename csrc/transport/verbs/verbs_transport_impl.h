// The verbs transport's class. Split over three files by concern:
//   verbs_transport.cc  memory, the data path, shutdown, the factory;
//   verbs_connect.cc    rdma_cm: listen/connect/accept on the cm thread;
//   verbs_progress.cc   the completion (progress) thread.
//
// Threads:
//   * the connection-manager (cm) thread reads the rdma_cm event channel and
//     drives every connection through resolve -> connect -> established (and
//     the accepting side's checks); connect() and awaitAccepted() just wait
//     for it. It never calls the sink.
//   * the progress thread polls the device's shared CQ and is the ONLY
//     thread that calls the sink. Failures noticed elsewhere (closePath(),
//     a DISCONNECTED event, a post on a dead path) and reconnects (onPathUp)
//     are handed to it as tasks, so "onPathError first, then every
//     unfinished write with ok=false" holds by construction, and a sink never
//     runs inside a caller's postWrite(). It acts on a path's errors only
//     once the path is established: until then the path, its QP and its cm
//     id belong to the cm thread, which may be tearing a failed attempt down.
//
// Ownership: every Conn (and so every Path and the WorkSlots that wr_ids
// point to) lives until shutdown(); a failed attempt gives back its QP,
// buffers and cm id at once, but keeps the slots for late completions.
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/published_sources.h"
#include "transport/transport.h"
#include "transport/verbs/cm_wire.h"
#include "transport/verbs/device.h"
#include "transport/verbs/gid_table.h"
#include "transport/verbs/memory_window.h"
#include "transport/verbs/path.h"
#include "transport/verbs/verbs_transport.h"

namespace maestro {
namespace transport {
namespace verbs {

class VerbsTransport final : public Transport {
 public:
  explicit VerbsTransport(const TransportOptions& options);
  ~VerbsTransport() override;

  Capabilities capabilities() const override { return kCapabilities; }
  RouteControl* routeControl() override { return nullptr; }  // see kCapabilities
  Fencing* fencing() override { return nullptr; }

  Region registerMemory(void* addr, size_t length) override;
  void deregisterMemory(const Region& region) override;
  // Where the device has memory windows (memory_window.h), a region is
  // remotely writable only while exposed: expose() binds a window over it and
  // returns the window's fresh rkey; conceal() invalidates it, so once it
  // returns no write with any earlier key lands (the NIC refuses it and the
  // writer's path fails). Without memory windows a region is writable with
  // its MR's rkey from registration to deregistration, and these return that
  // key and do nothing (said once at INFO).
  uint64_t expose(const Region& region) override;
  void conceal(const Region& region) override;

  std::string listen(const std::string& local_addr) override;
  void connect(const PathSpec& spec, const Hello& hello, Deadline deadline) override;
  void awaitAccepted(size_t count, Deadline deadline) override;
  std::vector<int> awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                     Deadline deadline) override;
  // From now on a connection request is accepted only from the address its
  // rank published for that path; requests that came earlier (with the
  // right secret) waited for this and are decided now.
  void expectPeers(const std::vector<std::vector<std::string>>& endpoints) override;

  // Same local vNIC, same endpoint, same hello as the connect() that first
  // opened the path. Not the same UDP source port, though: RoCEv2 takes it
  // from the NIC (rxe hashes the QP number), and a new QP has a new number,
  // so ECMP may put the new connection on a different route.
  bool reconnect(int peer, int path, Deadline deadline) override;
  void postWrite(int peer, int path, const WriteRequest& req) override;
  void postSend(int peer, int path, const void* data, size_t length) override;
  void closePath(int peer, int path, const std::string& why) override;

  std::string describePath(int peer, int path) const override;
  // The NIC port the path's QP runs on (its counters are the device's); no
  // per-path counters of its own.
  PathCounters pathCounters(int peer, int path) const override;
  // Unknown: the adapter retries on its own, and tells nothing until it
  // gives up (the path then fails).
  PathDelivery delivery(int peer, int path) const override { return {}; }

  void shutdown() override;

  ibv_qp* pathQp(int peer, int path) const;

 private:
  enum class ConnState { kPending, kEstablished, kFailed };
  // One rdma_cm connection (or one attempt at one) and its path. Owned by
  // conns_ until shutdown: completions may still point into its Path.
  struct Conn {
    rdma_cm_id* id = nullptr;
    int peer = -1;
    int index = -1;          // path index
    std::unique_ptr<Path> path;  // created once the device is known
    bool passive = false;
    ConnState state = ConnState::kPending;
    bool retryable = false;  // failed, but trying again may help (nobody listening yet)
    bool abandoned = false;  // connect() gave up waiting for it
    std::string error;
    uint8_t hello[kHelloWireBytes] = {};  // active side: the encoded hello to send
  };
  struct Task {
    enum Kind { kFailPath, kFlushWrite, kPathUp } kind;
    Path* path;
    uint64_t wr_id;   // kFlushWrite: the write to complete with ok=false
    std::string why;  // kFailPath: what to report
  };

  // ---- verbs_transport.cc ----
  Device* deviceFor(ibv_context* context);  // requires mu_
  Path* livePath(int peer, int path) const;
  std::unique_ptr<Path> newPath(int peer, int index, Device* device) const;

  // ---- verbs_connect.cc ----
  // Remembers the GID of the first local vNIC address (the window binder's
  // QP is connected to itself through it). Requires mu_.
  void noteLocalAddress(const std::string& local_addr);
  void cmLoop();
  void handleCmEvent(rdma_cm_event* event, std::vector<Conn*>* discard);
  void onConnectRequest(rdma_cm_event* event, std::vector<rdma_cm_id*>* reject_ids);
  // Accepts a request whose hello passed, or rejects it (wrong address, no
  // resources). Requires mu_ and peers_known_.
  void admit(rdma_cm_id* id, const Hello& hello, std::vector<rdma_cm_id*>* reject_ids);
  void reject(rdma_cm_id* id, const std::string& reason, std::vector<rdma_cm_id*>* reject_ids);
  void onEstablished(Conn* conn);
  void failAttempt(Conn* conn, bool retryable, const std::string& error, std::vector<Conn*>* discard);
  std::string describeConn(const Conn& conn) const;

  // ---- verbs_progress.cc ----
  void progressLoop();
  void handleCompletion(const ibv_wc& wc);
  void runTasks();
  void enqueue(const Task& task);
  // Progress thread only: raises onPathError(why) unless the path already
  // failed, then completes its unfinished writes with ok=false.
  void failPath(Path* path, const std::string& why);
  // Closes the path and lets the progress thread raise the error.
  void requestPathFailure(Path* path, const std::string& why);

  const TransportOptions options_;
  CompletionSink* const sink_;
  const int send_depth_;
  const int recv_depth_;

  ibv_context** device_list_ = nullptr;
  int num_devices_ = 0;
  rdma_event_channel* cm_channel_ = nullptr;
  int cm_wake_fd_ = -1;
  int progress_wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> shut_down_{false};
  std::thread cm_thread_;
  std::thread progress_thread_;

  // mu_ guards the connection state below and the device choice.
  mutable std::mutex mu_;
  std::condition_variable cm_cv_;
  std::unique_ptr<Device> device_;
  std::vector<rdma_cm_id*> listeners_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::pair<int, int>, Conn*> live_;  // (peer, path) -> established connection
  struct Initiated {  // what connect() was given, for reconnect()
    PathSpec spec;
    Hello hello;
  };
  std::map<std::pair<int, int>, Initiated> initiated_;
  size_t accepted_ = 0;
  std::vector<std::string> rejections_;  // recent reasons, for awaitAccepted()'s message
  // Where each rank's paths come from (expectPeers); until then requests
  // with the right secret wait, undecided, in parked_.
  PublishedSources sources_;
  bool peers_known_ = false;
  struct Parked {
    rdma_cm_id* id;
    Hello hello;
  };
  std::vector<Parked> parked_;

  // ---- verbs_transport.cc: memory ----
  struct Registered {
    ibv_mr* mr = nullptr;
    ibv_mw* mw = nullptr;  // allocated on the first expose()
    int exposed = 0;       // expose() minus conceal()
    uint32_t rkey = 0;     // the key of the current exposure
  };
  // The window binder, created on first use; null when the device has no
  // memory windows. Requires regions_mu_.
  WindowBinder* binder();
  void releaseWindow(Registered& r);  // requires regions_mu_

  std::mutex regions_mu_;
  std::map<uint32_t, Registered> regions_;
  uint32_t next_region_id_ = 1;
  bool windows_checked_ = false;          // regions_mu_: binder_ decided
  std::unique_ptr<WindowBinder> binder_;  // regions_mu_
  GidEntry local_gid_;                    // mu_: of the first local vNIC address seen (index -1: none yet)

  std::mutex tasks_mu_;
  std::deque<Task> tasks_;
  std::atomic<bool> tasks_pending_{false};
};

static_assert(declaresWhatItImplements<VerbsTransport>(kCapabilities));

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
