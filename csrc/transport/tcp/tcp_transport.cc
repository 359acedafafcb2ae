#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/net.h"
#include "common/random.h"
#include "common/thread.h"
#include "transport/tcp/frame.h"

namespace maestro {
namespace transport {
namespace tcp {
namespace {

// A connecting peer gets this long to present its hello (it sends it right
// after connecting, so a legitimate one takes a round trip).
constexpr auto kHelloTimeout = std::chrono::milliseconds(2000);
// Connections whose hello is still being read, per transport. A new one
// beyond this gives up the oldest: a flood of silent connections costs
// each of them its slot, never a legitimate path its turn.
constexpr size_t kMaxPendingHellos = 64;
// Refusals warned about per transport; later ones are traced only.
constexpr size_t kRefusalsWarned = 8;

}  // namespace

// A listening socket on the event loop: accepts every connection waiting.
class TcpTransport::Listener : public EventLoop::Handler {
 public:
  Listener(TcpTransport* owner, int fd) : owner_(owner), fd_(fd) {}
  ~Listener() override { ::close(fd_); }
  int fd() const { return fd_; }
  void stop() { stopped_ = true; }
  void onEvents(uint32_t) override {
    for (;;) {
      if (stopped_) return;  // the transport is shutting down: owner_ may go
      int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          MAESTRO_WARN("tcp listener: accept failed: ", net::errnoText(errno));  // e.g. EMFILE: retried
        return;
      }
      owner_->startHello(fd);
    }
  }

 private:
  TcpTransport* const owner_;
  const int fd_;
  std::atomic<bool> stopped_{false};
};

// One accepted connection until its hello is complete: reads what has
// arrived, never waits for the rest.
class TcpTransport::HelloReader : public EventLoop::Handler,
                                  public std::enable_shared_from_this<HelloReader> {
 public:
  HelloReader(TcpTransport* owner, int fd) : owner_(owner), fd_(fd), from_(net::peerAddress(fd).str()) {}
  ~HelloReader() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  const std::string& from() const { return from_; }
  const HelloWire& hello() const { return hello_; }
  uint64_t id = 0;  // registration on the loop
  // Whoever sets this first owns the end of the handshake (the loop on a
  // complete hello or the deadline, or shutdown); the others do nothing.
  bool claim() { return !finished_.exchange(true); }
  // The descriptor passes to whoever installs the path.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void onEvents(uint32_t) override {
    auto* bytes = reinterpret_cast<uint8_t*>(&hello_);
    while (got_ < sizeof hello_) {
      ssize_t n = ::recv(fd_, bytes + got_, sizeof hello_ - got_, 0);
      if (n > 0) {
        got_ += static_cast<size_t>(n);
      } else if (n == 0) {
        return end(false, "closed before its hello");
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;  // the rest later (or the deadline)
      } else {
        return end(false, strcat("reset by the peer before its hello (", net::errnoText(errno), ")"));
      }
    }
    end(true, "");
  }
  void expire() { end(false, strcat("sent ", got_, " of the ", sizeof hello_, " bytes of a hello within ", kHelloTimeout.count(), " ms")); }

 private:
  void end(bool complete, const std::string& why) {
    if (!claim()) return;
    owner_->finishHello(shared_from_this(), complete, why);
  }
  TcpTransport* const owner_;
  int fd_;
  const std::string from_;
  HelloWire hello_;
  size_t got_ = 0;
  std::atomic<bool> finished_{false};
};

TcpTransport::TcpTransport(const TransportOptions& options) : options_(options), loop_(EventLoop::shared()) {
  MAESTRO_CHECK(options_.sink != nullptr, "TcpTransport needs a completion sink");
  if (options_.busy_poll) loop_->busyPoll(true);
  regions_.setRevoker([this](uint32_t region) {
    std::vector<std::shared_ptr<TcpPath>> paths;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& kv : paths_) paths.push_back(kv.second);
      paths.insert(paths.end(), retired_.begin(), retired_.end());
    }
    for (auto& p : paths) p->revoke(region);
  });
}

TcpTransport::~TcpTransport() {
  shutdown();
  if (options_.busy_poll) loop_->busyPoll(false);
}

std::string TcpTransport::listen(const std::string& local_addr) {
  int fd = options_.port_lo != 0
               ? net::listenInRange(local_addr, options_.port_lo, options_.port_hi, 128, options_.share_listen_ports)
               : net::listenOn(local_addr, 0, 128, options_.share_listen_ports);
  std::string endpoint = net::localAddress(fd).str();
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    fail("listen on ", endpoint, ": cannot make the socket non-blocking: ", net::errnoText(err));
  }
  auto listener = std::make_shared<Listener>(this, fd);
  std::lock_guard<std::mutex> lock(mu_);
  MAESTRO_CHECK(!stopping_, "listen on ", endpoint, ": the transport is shut down");
  listeners_.emplace_back(loop_->add(fd, listener, false), listener);
  return endpoint;
}

void TcpTransport::startHello(int fd) {
  std::shared_ptr<HelloReader> reader;
  try {
    reader = std::make_shared<HelloReader>(this, fd);
  } catch (const Error&) {  // getpeername failed: the connection is already gone
    ::close(fd);
    return;
  }
  // On the loop thread (the listener's call): no event of `fd` is handled
  // before this returns.
  const uint64_t id = loop_->add(fd, reader, false);
  std::shared_ptr<HelloReader> oldest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      loop_->remove(id, fd);  // `reader` closes it
      return;
    }
    reader->id = id;
    if (hellos_.size() >= kMaxPendingHellos) oldest = hellos_.front();
    hellos_.push_back(reader);
  }
  if (oldest && oldest->claim())
    finishHello(oldest, false, strcat("gave up on its hello: more than ", kMaxPendingHellos,
                                      " connections were waiting to present theirs"));
  std::weak_ptr<HelloReader> weak = reader;
  loop_->postAfter(kHelloTimeout, [weak] {
    if (auto r = weak.lock()) r->expire();
  });
}

void TcpTransport::finishHello(const std::shared_ptr<HelloReader>& reader, bool complete, const std::string& why) {
  loop_->remove(reader->id, reader->fd());
  {
    std::lock_guard<std::mutex> lock(mu_);
    hellos_.erase(std::remove(hellos_.begin(), hellos_.end(), reader), hellos_.end());
  }
  if (!complete) {
    // A route probe that reached us (same leaf) connects and resets at
    // once: not worth a warning.
    if (why.find("before its hello") != std::string::npos)
      MAESTRO_TRACE("connection from ", reader->from(), " ", why, " (a route probe?)");
    else if (refused_++ < kRefusalsWarned)
      MAESTRO_WARN("connection from ", reader->from(), " ", why);
    return;  // `reader` closes it
  }
  try {
    admit(reader->release(), reader->hello());
  } catch (const Error& e) {
    if (refused_++ < kRefusalsWarned) MAESTRO_WARN("refused a connection: ", e.what());
    else MAESTRO_TRACE("refused a connection: ", e.what());
  }
}

void TcpTransport::admit(int fd, const HelloWire& hello) {
  std::string from;
  std::string from_ip;
  try {
    net::SockAddr peer = net::peerAddress(fd);
    from = peer.str();
    from_ip = peer.ip();
  } catch (const Error& e) {
    ::close(fd);
    throw;
  }
  HelloStatus status =
      checkHello(hello, options_.secret.data(), options_.secret.size(), options_.rank, options_.world_size);
  if (status == HelloStatus::kOk) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    if (!peers_known_) {
      // Secret checked, but not yet where this rank's paths come from: it
      // waits (the peer waits for our answer) until expectPeers().
      parked_.push_back({fd, hello});
      return;
    }
    if (!sources_.admits(hello.rank, hello.path, from_ip)) status = HelloStatus::kBadAddress;
  }
  // A hello for a path we still think is up is a reconnect: the peer saw
  // the old connection die first (e.g. a blackhole that only it noticed).
  // The new connection replaces the old one (install() flushes it); it
  // comes from the same address as every connection of that path.
  HelloReply reply;
  reply.status = static_cast<uint32_t>(status);
  // 8 bytes into the empty send buffer of a fresh connection: never short.
  if (::send(fd, &reply, sizeof reply, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof reply) &&
      status == HelloStatus::kOk) {
    int err = errno;
    ::close(fd);
    fail("connection from ", from, " (rank ", hello.rank, " path ", hello.path, "): cannot answer its hello: ",
         net::errnoText(err));
  }
  if (status != HelloStatus::kOk) {
    ::close(fd);
    fail("connection from ", from, " (claims rank ", hello.rank, " path ", hello.path,
         "): ", helloStatusText(status));
  }
  install(hello.rank, hello.path, fd, true, hello.connection);
}

void TcpTransport::expectPeers(const std::vector<std::vector<std::string>>& endpoints) {
  PublishedSources sources(endpoints, options_.world_size, "tcp");
  std::vector<Parked> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sources_ = std::move(sources);
    peers_known_ = true;
    parked.swap(parked_);
  }
  // On the loop, like every other admission: one at a time, in order.
  for (auto& p : parked)
    loop_->post([this, p] {
      try {
        admit(p.fd, p.hello);
      } catch (const Error& e) {
        if (refused_++ < kRefusalsWarned) MAESTRO_WARN("refused a connection: ", e.what());
      }
    });
}

void TcpTransport::install(int peer, int path, int fd, bool accepted, uint64_t connection) {
  std::string desc = strcat(net::localAddress(fd).str(), " <-> ", net::peerAddress(fd).str());
  std::shared_ptr<TcpPath> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = paths_.find({peer, path});
    if (it != paths_.end()) old = it->second;
  }
  // The connection being replaced fails first: its outstanding writes come
  // back flushed and move to live paths -- nothing waits on a dead socket.
  if (old) old->close("replaced by a new connection for the same path");
  if (!options_.tcp_congestion.empty()) {
    try {
      net::setCongestion(fd, options_.tcp_congestion, "MAESTRO_TCP_CONGESTION");
    } catch (const Error& e) {  // checked when the knob was read: not expected here
      MAESTRO_WARN("path ", path, " to rank ", peer, " keeps the kernel's default: ", e.what());
    }
  }
  auto p = std::make_shared<TcpPath>(fd, peer, path, desc, options_.sink, &regions_, loop_.get(), options_.single_copy,
                                     connection);
  if (old) p->inheritFenceDrops(*old);
  std::vector<std::shared_ptr<TcpPath>> done;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;  // shutdown() ran meanwhile: `p` closes the socket unstarted
    paths_[{peer, path}] = p;
    p->start();
    if (accepted) ++accepted_;
    // A replaced connection may still have failed writes to deliver (a
    // flush handed to the loop): retire it, and reap the retired
    // connections that have nothing left to deliver.
    if (old) retired_.push_back(std::move(old));
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (it->use_count() == 1 && (*it)->settled()) {
        done.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  done.clear();
  accepted_cv_.notify_all();
  MAESTRO_TRACE("path ", path, " to rank ", peer, " up: ", desc);
  // Also for a path that never connected before (it was down at start-up).
  options_.sink->onPathUp(peer, path);
  // `old` is stopped and closed when the last reference goes.
}

int TcpTransport::open(const PathSpec& spec, const Hello& hello, uint16_t local_port, Deadline deadline,
                       uint64_t* connection) {
  if (local_port != 0) {
    // A port reserved for discovery: connect from it, the 5-tuple probed.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reserved_.find({spec.local_addr, local_port});
    if (it != reserved_.end()) {
      ::close(it->second);
      reserved_.erase(it);
    }
  }
  int fd = net::connectFrom(spec.local_addr, net::parseEndpoint(spec.remote_endpoint), deadline, local_port);
  try {
    HelloWire wire;
    std::memcpy(wire.secret, hello.secret, sizeof wire.secret);
    wire.rank = hello.rank;
    wire.path = hello.path;
    wire.connection = *connection = randomU64();
    net::writeFull(fd, &wire, sizeof wire);
    HelloReply reply;
    if (!net::waitReadable(fd, deadline)) fail("no answer to the hello before the deadline");
    if (!net::readFull(fd, &reply, sizeof reply)) fail("the peer closed the connection during the hello");
    if (reply.magic != kHelloMagic) fail("the peer is not a maestro endpoint");
    if (reply.status != 0)
      fail("the peer refused the connection: ", helloStatusText(static_cast<HelloStatus>(reply.status)));
  } catch (const Error& e) {
    ::close(fd);
    fail("path ", spec.path, " to rank ", spec.peer, " (", spec.local_addr, " -> ", spec.remote_endpoint,
         "): ", e.what());
  }
  return fd;
}

void TcpTransport::connect(const PathSpec& spec, const Hello& hello, Deadline deadline) {
  {
    // Recorded before the attempt: a path that fails to connect at start-up
    // is this side's to reopen later.
    std::lock_guard<std::mutex> lock(mu_);
    initiated_[{spec.peer, spec.path}] = Initiated{spec, hello, spec.local_port};
  }
  uint64_t connection = 0;
  int fd = open(spec, hello, spec.local_port, deadline, &connection);
  {
    std::lock_guard<std::mutex> lock(mu_);
    initiated_[{spec.peer, spec.path}].local_port = net::localAddress(fd).port();
  }
  install(spec.peer, spec.path, fd, false, connection);
}

bool TcpTransport::reconnect(int peer, int path, Deadline deadline) {
  return openAgain(peer, path, std::nullopt, deadline);
}

bool TcpTransport::reopen(int peer, int path, uint16_t local_port, Deadline deadline) {
  return openAgain(peer, path, local_port, deadline);
}

bool TcpTransport::openAgain(int peer, int path, std::optional<uint16_t> local_port, Deadline deadline) {
  Initiated init;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = initiated_.find({peer, path});
    MAESTRO_CHECK(it != initiated_.end(), "path ", path, " to rank ", peer, " was not opened here");
    init = it->second;
  }
  int fd = -1;
  uint64_t connection = 0;
  try {
    if (local_port) {
      fd = open(init.spec, init.hello, *local_port, deadline, &connection);  // the port hunting chose
    } else {
      try {
        fd = open(init.spec, init.hello, init.local_port, deadline, &connection);  // same 5-tuple
      } catch (const Error& e) {
        if (std::string(e.what()).find("bind") == std::string::npos) throw;
        fd = open(init.spec, init.hello, 0, deadline, &connection);  // port still held: a new one
      }
    }
  } catch (const Error& e) {
    MAESTRO_TRACE("re-opening path ", path, " to rank ", peer, " failed: ", e.what());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    initiated_[{peer, path}].local_port = net::localAddress(fd).port();
  }
  install(peer, path, fd, false, connection);
  return true;
}

uint16_t TcpTransport::reservePort(const std::string& local_addr) {
  int fd = net::bindReusable(net::parseAddress(local_addr, 0));
  uint16_t port = net::localAddress(fd).port();
  std::lock_guard<std::mutex> lock(mu_);
  reserved_[{local_addr, port}] = fd;
  return port;
}

void TcpTransport::releasePort(const std::string& local_addr, uint16_t port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reserved_.find({local_addr, port});
  if (it == reserved_.end()) return;
  ::close(it->second);
  reserved_.erase(it);
}

std::vector<std::string> TcpTransport::probeRoutes(const std::vector<RouteProbe>& probes, int ttl, Deadline deadline,
                                                   std::string* why) {
  std::vector<std::pair<std::string, std::string>> endpoints;
  for (const auto& p : probes) endpoints.emplace_back(p.local_endpoint, p.remote_endpoint);
  return net::probeHops(endpoints, ttl, deadline, why);
}

void TcpTransport::awaitAccepted(size_t count, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!accepted_cv_.wait_until(lock, deadline, [&] { return accepted_ >= count || stopping_; }))
    fail("only ", accepted_, " of ", count, " expected paths were opened by the peers before the timeout");
}

std::vector<int> TcpTransport::awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                                 Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto present = [&] {
    std::vector<int> v;
    for (int path : paths)
      if (paths_.count({peer, path})) v.push_back(path);
    return v;
  };
  accepted_cv_.wait_until(lock, deadline, [&] { return stopping_ || present().size() == paths.size(); });
  std::vector<int> got = present();
  if (got.size() < at_least)
    fail("rank ", peer, " opened ", got.size(), " of the ", paths.size(), " paths expected to this rank before the "
         "timeout");
  return got;
}

std::shared_ptr<TcpPath> TcpTransport::findPath(int peer, int path) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = paths_.find({peer, path});
  return it == paths_.end() ? nullptr : it->second;
}

std::shared_ptr<TcpPath> TcpTransport::pathFor(int peer, int path) const {
  std::shared_ptr<TcpPath> p = findPath(peer, path);
  MAESTRO_CHECK(p, "no path ", path, " to rank ", peer);
  return p;
}

std::string TcpTransport::describePath(int peer, int path) const {
  std::shared_ptr<TcpPath> p = findPath(peer, path);
  return p ? p->description() : std::string("(not connected)");
}

// The getsockopt of these two runs outside the transport's lock.
PathCounters TcpTransport::pathCounters(int peer, int path) const {
  std::shared_ptr<TcpPath> p = findPath(peer, path);
  return p ? p->counters() : PathCounters{};
}

PathDelivery TcpTransport::delivery(int peer, int path) const {
  std::shared_ptr<TcpPath> p = findPath(peer, path);
  return p ? p->delivery() : PathDelivery{};
}

uint64_t TcpTransport::withdrawWrites(int peer, int path) {
  std::shared_ptr<TcpPath> p = findPath(peer, path);
  return p ? p->withdraw() : 0;
}

void TcpTransport::dropWritesUntil(int peer, int path, uint64_t mark) {
  if (std::shared_ptr<TcpPath> p = findPath(peer, path)) p->dropUntil(mark);
}

void TcpTransport::postWrite(int peer, int path, const WriteRequest& req) { pathFor(peer, path)->postWrite(req); }

void TcpTransport::postSend(int peer, int path, const void* data, size_t length) {
  pathFor(peer, path)->postSend(data, length);
}

void TcpTransport::closePath(int peer, int path, const std::string& why) { pathFor(peer, path)->close(why); }

void TcpTransport::shutdown() {
  std::vector<std::shared_ptr<TcpPath>> paths;
  std::vector<std::pair<uint64_t, std::shared_ptr<Listener>>> listeners;
  std::vector<std::shared_ptr<HelloReader>> hellos;
  std::vector<Parked> parked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    paths.swap(retired_);
    for (auto& kv : paths_) paths.push_back(std::move(kv.second));
    paths_.clear();
    listeners.swap(listeners_);
    hellos.swap(hellos_);
    parked.swap(parked_);
  }
  accepted_cv_.notify_all();
  for (auto& l : listeners) {
    l.second->stop();
    loop_->remove(l.first, l.second->fd());
  }
  for (auto& h : hellos)
    if (h->claim()) loop_->remove(h->id, h->fd());
  for (auto& p : parked) ::close(p.fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : reserved_) ::close(kv.second);
    reserved_.clear();
  }
  for (auto& p : paths) p->stop();
  paths.clear();
  // A path's, listener's or hello's call may still be running on the loop
  // (remove() does not wait for it): it refers to this transport, and its
  // completions go to our sink, which the caller is free to destroy once we
  // return. Parked admissions posted by expectPeers() run before this too.
  loop_->quiesce();
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
