// rdma_cm side of the verbs transport: listen(), connect(), awaitAccepted()
// and the connection-manager thread that drives them.
//
// Active side, per attempt: rdma_resolve_addr(src = the path's vNIC) ->
// ADDR_RESOLVED -> rdma_resolve_route -> ROUTE_RESOLVED -> create the QP and
// rdma_connect(private data = hello) -> ESTABLISHED. Binding the source
// address is what puts the QP on that alias's RoCEv2 GID: rdma_cm picks the
// sgid_index from the resolved source address. An attempt that fails in a
// way a retry can fix (nobody listening yet, ARP not resolved) is retried
// with back-off until the caller's deadline.
//
// Passive side: CONNECT_REQUEST -> check the hello (secret, rank, path)
// before anything is allocated -> check that it comes from the address its
// rank published for that path (a request that arrives before expectPeers()
// waits for it, unanswered) -> create the QP, pre-post receives,
// rdma_accept (or rdma_reject with a reason) -> ESTABLISHED counts one
// accepted path.
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/thread.h"
#include "transport/verbs/cm_wire.h"
#include "transport/verbs/verbs_transport_impl.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

constexpr int kListenBacklog = 128;
constexpr int kRouteTimeoutMs = 2000;
constexpr int kMaxResolveTimeoutMs = 5000;
constexpr int kMaxPathIndex = 1024;  // sanity bound on a hello's path index
constexpr size_t kKeptRejections = 8;
// RNR retries: 7 = retry forever, so a receiver that is briefly out of
// posted receives slows the sender down instead of failing the path.
// Transport retries (after an ACK timeout): 6, not 7. The spec reads 7 as 7
// tries, but Soft-RoCE (rxe) treats 7 as "forever" here too, so a path whose
// peer has vanished would never fail; 6 fails it on every provider.
constexpr uint8_t kRetryCount = 6;
constexpr uint8_t kRnrRetryCount = 7;
// Local ACK timeout, 4.096 us * 2^14 = 67 ms per try (Gloo's choice), so a
// lost packet is resent quickly and a dead path fails its writes with
// RETRY_EXC_ERR within about half a second (1 + 6 tries), for the layer above
// to move the chunks elsewhere. rdma_cm's default for RoCE is about 1 s per
// try. (Large fabrics with long PFC pauses may want more; NCCL uses 18.)
constexpr uint8_t kAckTimeout = 14;

// Applies kAckTimeout to the QP that rdma_connect/rdma_accept will move to
// RTS. Older kernels lack the option: keep their default then.
void setAckTimeout(rdma_cm_id* id) {
  uint8_t timeout = kAckTimeout;
  if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof(timeout)) != 0) {
    MAESTRO_TRACE("verbs: rdma_set_option(ACK_TIMEOUT) failed: ", std::strerror(errno), "; using the default");
  }
}

std::string errnoText(const char* call) { return strcat(call, ": ", std::strerror(errno)); }

// Fields both sides put into their connection parameters.
rdma_conn_param connParam() {
  rdma_conn_param param{};
  // Only WRITEs and SENDs are used; one outstanding RDMA READ/atomic each way
  // is requested anyway because some providers refuse zero.
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = kRetryCount;
  param.rnr_retry_count = kRnrRetryCount;
  return param;
}

}  // namespace

// ---- listen / connect / accept (caller threads) -------------------------------

void VerbsTransport::noteLocalAddress(const std::string& local_addr) {
  if (local_gid_.index >= 0) return;
  GidEntry entry;
  if (findRoceV2Gid(local_addr, &entry)) local_gid_ = entry;
}

std::string VerbsTransport::listen(const std::string& local_addr) {
  MAESTRO_CHECK(!stopping_, "verbs: listen after shutdown");
  sockaddr_storage addr;
  makeSockaddr(local_addr, 0, &addr);  // port 0: the kernel picks a free one
  rdma_cm_id* id = nullptr;
  MAESTRO_CHECK(rdma_create_id(cm_channel_, &id, nullptr, RDMA_PS_TCP) == 0, "verbs: listen(", local_addr,
                "): ", errnoText("rdma_create_id"));
  try {
    MAESTRO_CHECK(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) == 0, "verbs: listen(", local_addr,
                  "): ", errnoText("rdma_bind_addr"), " (is it an address of this host, on an RDMA NIC?)");
    MAESTRO_CHECK(id->verbs != nullptr, "verbs: listen(", local_addr, "): the address is not on an RDMA device");
    {
      std::lock_guard<std::mutex> lock(mu_);
      deviceFor(id->verbs);
      noteLocalAddress(local_addr);
    }
    MAESTRO_CHECK(rdma_listen(id, kListenBacklog) == 0, "verbs: listen(", local_addr, "): ",
                  errnoText("rdma_listen"));
  } catch (...) {
    rdma_destroy_id(id);
    throw;
  }
  const std::string endpoint = sockaddrToString(rdma_get_local_addr(id));
  {
    std::lock_guard<std::mutex> lock(mu_);
    listeners_.push_back(id);
  }
  MAESTRO_INFO("verbs: listening on ", endpoint, " (", ibv_get_device_name(id->verbs->device), ")");
  return endpoint;
}

void VerbsTransport::connect(const PathSpec& spec, const Hello& hello, Deadline deadline) {
  const std::string what = strcat("verbs: path ", spec.path, " to peer ", spec.peer, " (", spec.local_addr,
                                  " -> ", spec.remote_endpoint, ")");
  MAESTRO_CHECK(spec.peer >= 0 && spec.peer < options_.world_size && spec.peer != options_.rank &&
                    spec.path >= 0 && spec.path < kMaxPathIndex,
                what, ": peer or path index out of range");
  std::string remote_ip;
  uint16_t remote_port = 0;
  splitEndpoint(spec.remote_endpoint, &remote_ip, &remote_port);
  sockaddr_storage src, dst;
  makeSockaddr(spec.local_addr, 0, &src);
  makeSockaddr(remote_ip, remote_port, &dst);
  {
    // Recorded before the attempt: a path that fails to connect at start-up
    // is this side's to reopen later.
    std::lock_guard<std::mutex> lock(mu_);
    initiated_[{spec.peer, spec.path}] = Initiated{spec, hello};
    noteLocalAddress(spec.local_addr);
  }

  std::string last_error;
  auto backoff = std::chrono::milliseconds(10);
  for (int attempt = 1;; ++attempt) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      MAESTRO_CHECK(!stopping_, what, ": the transport was shut down");
      conns_.push_back(std::make_unique<Conn>());
      Conn* conn = conns_.back().get();
      conn->peer = spec.peer;
      conn->index = spec.path;
      encodeHello(hello, conn->hello);
      if (rdma_create_id(cm_channel_, &conn->id, conn, RDMA_PS_TCP) != 0) {
        conn->id = nullptr;
        conn->state = ConnState::kFailed;
        fail(what, ": ", errnoText("rdma_create_id"));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      const int resolve_ms = static_cast<int>(std::max<long long>(100, std::min<long long>(left, kMaxResolveTimeoutMs)));
      // With an explicit source address rdma_cm binds the id to that
      // address's device and GID; the whole point of a vNIC.
      if (rdma_resolve_addr(conn->id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                            resolve_ms) != 0) {
        const std::string error = errnoText("rdma_resolve_addr");
        // No event was queued for the id: it can go right away.
        rdma_destroy_id(conn->id);
        conn->id = nullptr;
        conn->state = ConnState::kFailed;
        fail(what, ": ", error, " (is ", spec.local_addr, " an address of this host?)");
      }
      cm_cv_.wait_until(lock, deadline, [&] { return stopping_ || conn->state != ConnState::kPending; });
      MAESTRO_CHECK(!stopping_, what, ": the transport was shut down");
      if (conn->state == ConnState::kEstablished) {
        MAESTRO_INFO(what, " connected after ", attempt, " attempt(s): ", conn->path->description());
        return;
      }
      if (conn->state == ConnState::kPending) {
        conn->abandoned = true;  // the cm thread disposes of it when it next hears of it
        fail(what, ": not connected before the deadline (", attempt, " attempt(s)",
             last_error.empty() ? std::string() : "; last error: " + last_error, ")");
      }
      if (!conn->retryable) fail(what, ": ", conn->error);
      last_error = conn->error;
    }
    const auto now = Clock::now();
    if (now + backoff >= deadline) {
      fail(what, ": not connected before the deadline (", attempt, " attempt(s); last error: ", last_error, ")");
    }
    MAESTRO_TRACE(what, ": attempt ", attempt, " failed (", last_error, "), retrying");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

bool VerbsTransport::reconnect(int peer, int path, Deadline deadline) {
  Initiated init;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = initiated_.find({peer, path});
    MAESTRO_CHECK(it != initiated_.end(), "verbs: reconnect: path ", path, " to peer ", peer, " was not opened here");
    init = it->second;
  }
  try {
    connect(init.spec, init.hello, deadline);  // onEstablished() replaces the old connection
  } catch (const Error& e) {
    MAESTRO_TRACE("verbs: reconnect of path ", path, " to peer ", peer, " failed: ", e.what());
    return false;
  }
  return true;
}

void VerbsTransport::awaitAccepted(size_t count, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cm_cv_.wait_until(lock, deadline, [&] { return stopping_ || accepted_ >= count; });
  MAESTRO_CHECK(!stopping_, "verbs: awaitAccepted: the transport was shut down");
  if (accepted_ >= count) return;
  std::string rejected;
  for (const std::string& reason : rejections_) rejected += "; rejected " + reason;
  fail("verbs: only ", accepted_, " of ", count, " expected paths were accepted before the deadline", rejected);
}

std::vector<int> VerbsTransport::awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                                   Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto present = [&] {
    std::vector<int> v;
    for (int path : paths) {
      auto it = live_.find({peer, path});
      if (it != live_.end() && it->second != nullptr) v.push_back(path);
    }
    return v;
  };
  cm_cv_.wait_until(lock, deadline, [&] { return stopping_ || present().size() == paths.size(); });
  MAESTRO_CHECK(!stopping_, "verbs: awaitAcceptedFrom: the transport was shut down");
  std::vector<int> got = present();
  if (got.size() >= at_least) return got;
  std::string rejected;
  for (const std::string& reason : rejections_) rejected += "; rejected " + reason;
  fail("verbs: rank ", peer, " opened ", got.size(), " of the ", paths.size(), " paths expected to this rank before "
       "the deadline", rejected);
}

// ---- the connection-manager thread --------------------------------------------

void VerbsTransport::cmLoop() {
  setLogRank(options_.rank);
  nameThisThread("maestro-rdmacm");
  pollfd fds[2] = {{cm_channel_->fd, POLLIN, 0}, {cm_wake_fd_, POLLIN, 0}};
  while (!stopping_) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      MAESTRO_WARN("verbs: cm thread: poll failed: ", std::strerror(errno));
      break;
    }
    if (fds[1].revents != 0) {
      uint64_t value;
      (void)!read(cm_wake_fd_, &value, sizeof(value));
      // expectPeers() woke us: decide the requests that waited for it.
      std::vector<rdma_cm_id*> rejected;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (peers_known_ && !stopping_) {
          std::vector<Parked> parked;
          parked.swap(parked_);
          for (const Parked& p : parked) admit(p.id, p.hello, &rejected);
        }
      }
      for (rdma_cm_id* id : rejected) rdma_destroy_id(id);
    }
    rdma_cm_event* event = nullptr;
    while (!stopping_ && rdma_get_cm_event(cm_channel_, &event) == 0) {
      std::vector<Conn*> discard;
      std::vector<rdma_cm_id*> rejected;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
          onConnectRequest(event, &rejected);
        } else {
          handleCmEvent(event, &discard);
        }
      }
      rdma_ack_cm_event(event);
      // Only now: rdma_destroy_id waits for every event of its id to be acked.
      for (rdma_cm_id* id : rejected) rdma_destroy_id(id);
      for (Conn* conn : discard) {
        if (conn->path) conn->path->release();
        if (conn->id != nullptr) rdma_destroy_id(conn->id);
        conn->id = nullptr;
      }
    }
  }
}

void VerbsTransport::handleCmEvent(rdma_cm_event* event, std::vector<Conn*>* discard) {
  auto* conn = static_cast<Conn*>(event->id->context);
  if (conn == nullptr) {  // a listener's own event (the context of listeners is null)
    MAESTRO_INFO("verbs: listener event ", rdma_event_str(event->event), " (status ", event->status, ")");
    return;
  }
  switch (event->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (conn->abandoned) {
        failAttempt(conn, false, "abandoned", discard);
      } else if (rdma_resolve_route(event->id, kRouteTimeoutMs) != 0) {
        failAttempt(conn, true, errnoText("rdma_resolve_route"), discard);
      }
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      if (conn->abandoned) {
        failAttempt(conn, false, "abandoned", discard);
        break;
      }
      try {
        Device* device = deviceFor(event->id->verbs);
        conn->path = newPath(conn->peer, conn->index, device);
        conn->path->createQp(event->id);
        setAckTimeout(event->id);
        rdma_conn_param param = connParam();
        param.private_data = conn->hello;
        param.private_data_len = static_cast<uint8_t>(kHelloWireBytes);
        MAESTRO_CHECK(rdma_connect(event->id, &param) == 0, errnoText("rdma_connect"));
      } catch (const std::exception& e) {
        failAttempt(conn, false, e.what(), discard);
      }
      break;
    case RDMA_CM_EVENT_ESTABLISHED:
      onEstablished(conn);
      break;
    case RDMA_CM_EVENT_REJECTED: {
      std::string reason;
      if (decodeReject(event->param.conn.private_data, event->param.conn.private_data_len, &reason)) {
        failAttempt(conn, false, "rejected by the peer: " + reason, discard);
      } else {
        // rdma_cm's own rejection (IB CM reason in status): typically nobody
        // listens on that port yet, or the listener is gone.
        failAttempt(conn, true, strcat("rejected by the peer's rdma_cm (reason ", event->status,
                                       "): nothing listening at that endpoint?"), discard);
      }
      break;
    }
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR: {
      const std::string error = strcat(rdma_event_str(event->event), " (",
                                       event->status < 0 ? std::strerror(-event->status) : "status",
                                       " ", event->status, ")");
      if (conn->state == ConnState::kPending) {
        failAttempt(conn, true, error, discard);
      } else if (conn->state == ConnState::kEstablished) {
        requestPathFailure(conn->path.get(), "rdma_cm: " + error);
      }
      break;
    }
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL: {
      const std::string why = event->event == RDMA_CM_EVENT_DISCONNECTED
                                  ? "the peer closed the connection (rdma_cm DISCONNECTED)"
                                  : "the RDMA device was removed";
      if (conn->state == ConnState::kPending) {
        failAttempt(conn, true, why, discard);
      } else if (conn->state == ConnState::kEstablished) {
        // close() answers with our own rdma_disconnect, completing the
        // handshake, and moves the QP to the error state.
        requestPathFailure(conn->path.get(), why);
      }
      break;
    }
    default:  // TIMEWAIT_EXIT, ADDR_CHANGE, ...: nothing to do
      MAESTRO_TRACE("verbs: cm event ", rdma_event_str(event->event), " on path ", conn->index, " to peer ",
                    conn->peer);
      break;
  }
}

void VerbsTransport::onConnectRequest(rdma_cm_event* event, std::vector<rdma_cm_id*>* reject_ids) {
  rdma_cm_id* id = event->id;
  Hello hello;
  std::string reason;
  // Everything about the request is checked before anything is allocated.
  if (!decodeHello(event->param.conn.private_data, event->param.conn.private_data_len, &hello)) {
    reason = "not a maestro hello";
  } else if (!secretsEqual(hello.secret, options_.secret.data())) {
    reason = "wrong secret (the connecting process is not part of this job)";
  } else if (hello.rank < 0 || hello.rank >= options_.world_size || hello.rank == options_.rank) {
    reason = strcat("rank ", hello.rank, " is not a peer of rank ", options_.rank, " in a world of ",
                    options_.world_size);
  } else if (hello.path < 0 || hello.path >= kMaxPathIndex) {
    reason = strcat("path index ", hello.path, " out of range");
  }
  if (!reason.empty()) {
    reject(id, reason, reject_ids);
  } else if (!peers_known_) {
    // The secret is right, but where this rank's paths come from is not
    // known yet: the request waits (its connect waits for our answer).
    parked_.push_back({id, hello});
  } else {
    admit(id, hello, reject_ids);
  }
}

void VerbsTransport::expectPeers(const std::vector<std::vector<std::string>>& endpoints) {
  PublishedSources sources(endpoints, options_.world_size, "verbs");
  {
    std::lock_guard<std::mutex> lock(mu_);
    sources_ = std::move(sources);
    peers_known_ = true;
  }
  // The cm thread decides the parked requests, like every other request.
  const uint64_t one = 1;
  (void)!write(cm_wake_fd_, &one, sizeof(one));
}

void VerbsTransport::admit(rdma_cm_id* id, const Hello& hello, std::vector<rdma_cm_id*>* reject_ids) {
  // Only from the address the rank published for this path (a replacement
  // after a failure comes from there too): a process that learned the
  // secret cannot take a path over from elsewhere.
  const std::string from_ip = sockaddrIp(rdma_get_peer_addr(id));
  if (!sources_.admits(hello.rank, hello.path, from_ip)) {
    const std::string& want = sources_.of(hello.rank, hello.path);
    reject(id,
           strcat("it claims rank ", hello.rank, " path ", hello.path, ", which that rank opens from ",
                  want.empty() ? std::string("no published address") : want),
           reject_ids);
    return;
  }
  conns_.push_back(std::make_unique<Conn>());
  Conn* conn = conns_.back().get();
  conn->passive = true;
  conn->peer = hello.rank;
  conn->index = hello.path;
  try {
    Device* device = deviceFor(id->verbs);
    conn->path = newPath(hello.rank, hello.path, device);
    conn->path->createQp(id);  // receives are posted before the peer can send
    setAckTimeout(id);
    rdma_conn_param param = connParam();
    MAESTRO_CHECK(rdma_accept(id, &param) == 0, errnoText("rdma_accept"));
    conn->id = id;
    id->context = conn;
  } catch (const std::exception& e) {
    conn->state = ConnState::kFailed;
    if (conn->path) {
      std::vector<uint64_t> none;
      conn->path->fail(&none);  // so stray flush completions are dropped
      conn->path->release();
    }
    reject(id, strcat("cannot accept: ", e.what()), reject_ids);
  }
}

void VerbsTransport::reject(rdma_cm_id* id, const std::string& reason, std::vector<rdma_cm_id*>* reject_ids) {
  const std::string from = sockaddrToString(rdma_get_peer_addr(id));
  const std::string message = encodeReject(reason);
  rdma_reject(id, message.data(), static_cast<uint8_t>(message.size()));
  reject_ids->push_back(id);
  MAESTRO_WARN("verbs: rejected a connection from ", from, ": ", reason);
  rejections_.push_back(strcat(from, ": ", reason));
  if (rejections_.size() > kKeptRejections) rejections_.erase(rejections_.begin());
}

void VerbsTransport::onEstablished(Conn* conn) {
  if (conn->state != ConnState::kPending) return;
  if (conn->abandoned) {
    // connect() already gave up: do not leave a half-used path behind.
    conn->state = ConnState::kFailed;
    std::vector<uint64_t> none;
    conn->path->close("abandoned by connect()");
    conn->path->fail(&none);
    return;
  }
  conn->state = ConnState::kEstablished;
  conn->path->markEstablished(describeConn(*conn));
  Conn*& slot = live_[{conn->peer, conn->index}];
  const bool was_up_before = slot != nullptr && slot != conn;
  if (was_up_before) {
    // A reconnect (ours, or the peer's after it saw the old connection die
    // first). The old connection fails first, so its unfinished writes come
    // back flushed before the path is reported up again (tasks run in order).
    requestPathFailure(slot->path.get(), "replaced by a new connection for the same path");
  }
  slot = conn;
  if (conn->passive) ++accepted_;
  // Also for a path that never connected before (it was down at start-up).
  enqueue(Task{Task::kPathUp, conn->path.get(), 0, {}});
  cm_cv_.notify_all();
  MAESTRO_INFO("verbs: ", conn->passive ? "accepted" : "connected", " path ", conn->index, " with peer ",
               conn->peer, ": ", conn->path->description());
}

void VerbsTransport::failAttempt(Conn* conn, bool retryable, const std::string& error,
                                 std::vector<Conn*>* discard) {
  if (conn->state != ConnState::kPending) return;
  conn->state = ConnState::kFailed;
  conn->retryable = retryable;
  conn->error = error;
  if (conn->path) {
    // librdmacm moves the QP of a failed connection to the error state, which
    // flushes the pre-posted receives: a failed path drops those silently.
    std::vector<uint64_t> none;
    conn->path->fail(&none);
  }
  discard->push_back(conn);
  cm_cv_.notify_all();
}

std::string VerbsTransport::describeConn(const Conn& conn) const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  std::string gid = "gid_idx ?";
  if (conn.path->qp() != nullptr && ibv_query_qp(conn.path->qp(), &attr, IBV_QP_AV, &init) == 0) {
    gid = strcat("gid_idx ", static_cast<int>(attr.ah_attr.grh.sgid_index));
  }
  return strcat(sockaddrIp(rdma_get_local_addr(conn.id)), " -> ", sockaddrToString(rdma_get_peer_addr(conn.id)),
                " ", gid, " qp ", conn.path->qp() ? conn.path->qp()->qp_num : 0);
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
