// Small socket and address helpers shared by the TCP transport and the vNIC
// discovery. IPv4 and IPv6 literals are both accepted.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace maestro {
namespace net {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  std::string ip() const;
  std::string str() const;  // "ip:port" / "[ip6]:port"
};

bool isIpLiteral(const std::string& text);
SockAddr parseAddress(const std::string& ip, uint16_t port);       // throws on a non-literal
SockAddr parseEndpoint(const std::string& endpoint);               // "ip:port" / "[ip6]:port"
SockAddr localAddress(int fd);
SockAddr peerAddress(int fd);

// A listening TCP socket bound to ip:port (port 0: ephemeral). Returns the fd.
// share_port: SO_REUSEPORT, so that a route probe (discovery) can send a SYN
// from the listener's own address and port; off, no other socket can bind
// that port while it listens.
int listenOn(const std::string& ip, uint16_t port, int backlog = 128, bool share_port = false);
// The same on the first free port of [lo, hi], tried from a point that
// differs between processes (ranks of one host start together). A port is
// taken only if no other socket holds it -- share_port is set once the
// socket listens -- so two ranks never share a listening port. Throws
// naming the range when every port of it is taken.
int listenInRange(const std::string& ip, uint16_t lo, uint16_t hi, int backlog = 128, bool share_port = false);
// Connect from local_ip (bind before connect, ephemeral port) to `remote`
// before the deadline. Throws maestro::Error saying which address failed.
int connectFrom(const std::string& local_ip, const SockAddr& remote, Deadline deadline, uint16_t local_port = 0);
// A TCP socket bound to `addr` with SO_REUSEADDR and SO_REUSEPORT, so that a
// route probe can share its address and port (discovery). A failure says
// "cannot <purpose> <addr>: <why>".
int bindReusable(const SockAddr& addr, const char* purpose = "bind");
// A TCP socket bound to `addr` (SO_REUSEADDR; SO_REUSEPORT if share_port).
int bindTo(const SockAddr& addr, const char* purpose = "bind", bool share_port = false);
// A TTL-limited SYN from `local` (bound with reuse) to `remote`, non-blocking
// and with IP_RECVERR on: the router where the TTL runs out answers with an
// ICMP time-exceeded that readIcmpOffender() returns. Returns the fd, or -1
// when the 5-tuple is already a connection (the peer's probe of the other
// direction reached this host: no router between).
int startProbe(const SockAddr& local, const SockAddr& remote, int ttl);
// Close without TIME_WAIT (an RST): the port can be reused at once.
void closeWithReset(int fd);
// Read one ICMP error from the socket's error queue (IP_RECVERR); returns
// the address of the router that sent it, or "" if it was not an ICMP
// time-exceeded.
std::string readIcmpOffender(int fd);
// For each (local, remote): the address of the router `ttl` hops out on the
// route of that exact 5-tuple (Paris traceroute: TTL-limited SYNs, all sent
// at once); "" where the peer itself answered (no router that far) or
// nothing answered by the deadline. `why` says why answers are missing.
std::vector<std::string> probeHops(const std::vector<std::pair<SockAddr, SockAddr>>& probes, int ttl,
                                   Deadline deadline, std::string* why);
// The same, for ("ip:port", "ip:port") endpoints (port 0: the kernel picks).
std::vector<std::string> probeHops(const std::vector<std::pair<std::string, std::string>>& endpoints, int ttl,
                                   Deadline deadline, std::string* why);

// Blocking full reads/writes. readFull returns false on orderly EOF before the
// first byte; every other short read or error throws.
bool readFull(int fd, void* buf, size_t length);
void writeFull(int fd, const void* buf, size_t length);
// Wait until fd is readable or the deadline passes (false on timeout).
bool waitReadable(int fd, Deadline deadline);

void setNoDelay(int fd);
// Lower the socket's floor for its retransmission timeout (TCP_RTO_MIN_US,
// Linux 6.15 on) to kRtoFloorUs, where the kernel lets a process: a lost
// tail of a flight is resent within tens of ms, not 200, and a blackholed
// path shows its first unanswered resend as soon (path_health.h). Older
// kernels keep their 200 ms; nothing else changes.
constexpr int kRtoFloorUs = 50000;
void setRtoFloor(int fd);
// Set the socket's TCP congestion control (TCP_CONGESTION). Throws
// maestro::Error naming `knob`, the kernel's reason, and the algorithms the
// kernel has and allows without CAP_NET_ADMIN.
void setCongestion(int fd, const std::string& name, const char* knob);
// Whether this process may use `name` for its TCP sockets: tries it on a
// fresh socket (same network namespace and privileges as the paths), throws
// like setCongestion().
void checkCongestion(const std::string& name, const char* knob);
// What MAESTRO_TCP_CONGESTION's setting means for this process's paths:
// "kernel" -> "" (the kernel's default); a name -> that name; "auto" -> the
// kernel's default unless it is one known to collapse on shallow-buffered
// fabrics (bbr: BBR v1 does not back off on loss, and retransmits several
// per cent of what it sends through shallow switch queues), in which case
// cubic if this process may use it, else reno (allowed to every process).
// `why` says what was chosen and why.
std::string chooseCongestion(const std::string& setting, std::string* why);
// The congestion control a TCP socket runs ("" if it cannot be read).
std::string congestionOf(int fd);
void setCloseOnExec(int fd);
// Make room for `more` descriptors beyond those open now: raises the soft
// RLIMIT_NOFILE up to the hard one when needed, and otherwise throws
// maestro::Error naming `what` needs them and what to raise.
void reserveDescriptors(size_t more, const std::string& what);

// IPv4/IPv6 addresses of an interface, primary first. Throws if the interface
// does not exist or has none.
std::vector<std::string> interfaceAddresses(const std::string& ifname);
// The local address the kernel would use to reach `host` (IP or name).
std::string sourceAddressFor(const std::string& host);
// True when ip is assigned to an interface of this network namespace.
bool isLocalAddress(const std::string& ip);
// 127.0.0.0/8, ::1 or ::ffff:127.x.y.z.
bool isLoopbackAddress(const std::string& ip);
// Identifies this host *and* network namespace: ranks with equal identities
// can reach each other over loopback.
std::string hostIdentity();

std::string errnoText(int err);
// ICMP-caused errors that do not end an established TCP connection.
bool isSoftError(int err);

}  // namespace net
}  // namespace maestro
