// The TCP implementation of the transport contract: one TCP connection per
// path, bound (bind before connect) to the path's local vNIC address, so the
// network sees one distinct flow per path; RDMA WRITE emulated by frames that
// the receiver checks against its region table and lands in place.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "transport/published_sources.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/tcp_path.h"
#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace tcp {

// Every capability: route control (TTL-limited probes from the port a path
// then connects from), fences (the receiver drops a withdrawn write's frames
// behind the mark), a socket per path, a congestion control per path.
inline constexpr Capabilities kCapabilities{
    .route_control = true, .fencing = true, .descriptor_per_path = true, .congestion_control = true};

class TcpTransport final : public Transport, public RouteControl, public Fencing {
 public:
  explicit TcpTransport(const TransportOptions& options);
  ~TcpTransport() override;

  Capabilities capabilities() const override { return kCapabilities; }
  RouteControl* routeControl() override { return this; }
  Fencing* fencing() override { return this; }

  Region registerMemory(void* addr, size_t length) override { return regions_.add(addr, length); }
  void deregisterMemory(const Region& region) override { regions_.remove(region.id); }
  uint64_t expose(const Region& region) override { return regions_.expose(region.id); }
  void conceal(const Region& region) override { regions_.conceal(region.id); }

  std::string listen(const std::string& local_addr) override;
  void connect(const PathSpec& spec, const Hello& hello, Deadline deadline) override;
  void awaitAccepted(size_t count, Deadline deadline) override;
  std::vector<int> awaitAcceptedFrom(int peer, const std::vector<int>& paths, size_t at_least,
                                     Deadline deadline) override;
  void expectPeers(const std::vector<std::vector<std::string>>& endpoints) override;

  bool reconnect(int peer, int path, Deadline deadline) override;
  void postWrite(int peer, int path, const WriteRequest& req) override;
  void postSend(int peer, int path, const void* data, size_t length) override;
  void closePath(int peer, int path, const std::string& why) override;

  std::string describePath(int peer, int path) const override;
  PathCounters pathCounters(int peer, int path) const override;
  PathDelivery delivery(int peer, int path) const override;

  // RouteControl
  uint16_t reservePort(const std::string& local_addr) override;
  void releasePort(const std::string& local_addr, uint16_t port) override;
  std::vector<std::string> probeRoutes(const std::vector<RouteProbe>& probes, int ttl, Deadline deadline,
                                       std::string* why) override;
  bool reopen(int peer, int path, uint16_t local_port, Deadline deadline) override;

  // Fencing (tcp_fence.cc has the path's side)
  uint64_t withdrawWrites(int peer, int path) override;
  void dropWritesUntil(int peer, int path, uint64_t mark) override;

  void shutdown() override;

 private:
  class Listener;
  class HelloReader;
  // Listener: a connection came in; read its hello on the loop.
  void startHello(int fd);
  // HelloReader: the hello is complete (or the connection is given up):
  // check it, answer, install. Runs on the loop thread.
  void finishHello(const std::shared_ptr<HelloReader>& reader, bool complete, const std::string& why);
  void admit(int fd, const HelloWire& hello);
  std::shared_ptr<TcpPath> pathFor(int peer, int path) const;   // throws if there is none
  std::shared_ptr<TcpPath> findPath(int peer, int path) const;  // null if there is none
  void install(int peer, int path, int fd, bool accepted, uint64_t connection);
  // Connect, present the hello, wait for the answer; returns the fd.
  // `connection`: the number the hello gave the connection.
  int open(const PathSpec& spec, const Hello& hello, uint16_t local_port, Deadline deadline, uint64_t* connection);
  // reconnect() (no port: the same 5-tuple where possible) and reopen().
  bool openAgain(int peer, int path, std::optional<uint16_t> local_port, Deadline deadline);

  struct Initiated {
    PathSpec spec;
    Hello hello;
    uint16_t local_port = 0;
  };
  struct Parked {  // a hello with the right secret, before expectPeers()
    int fd;
    HelloWire hello;
  };

  const TransportOptions options_;
  RegionTable regions_;
  std::shared_ptr<EventLoop> loop_;  // the process's: drives every path

  mutable std::mutex mu_;
  std::condition_variable accepted_cv_;
  std::map<std::pair<int, int>, std::shared_ptr<TcpPath>> paths_;
  // Replaced connections, kept until their sender thread has flushed every
  // write they held (a write inside sendmsg() when the connection failed is
  // flushed only when the call returns) and nobody else holds them.
  std::vector<std::shared_ptr<TcpPath>> retired_;
  std::map<std::pair<int, int>, Initiated> initiated_;  // paths this side opened
  std::map<std::pair<std::string, uint16_t>, int> reserved_;  // (address, port) -> bound socket
  // Listening sockets and connections whose hello is being read are
  // handlers of the event loop, like the paths: no thread per group, and a
  // connection that sends half a hello (or nothing) holds only itself, for
  // at most the hello deadline.
  std::vector<std::pair<uint64_t, std::shared_ptr<Listener>>> listeners_;
  std::vector<std::shared_ptr<HelloReader>> hellos_;  // oldest first
  std::vector<Parked> parked_;
  bool peers_known_ = false;
  PublishedSources sources_;  // where each rank's paths come from (expectPeers)
  size_t accepted_ = 0;
  size_t refused_ = 0;  // connections refused or given up (warned about the first few)
  bool stopping_ = false;
};

static_assert(declaresWhatItImplements<TcpTransport>(kCapabilities));

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
