#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/errqueue.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/log.h"

namespace maestro {
namespace net {

std::string errnoText(int err) { return std::strerror(err); }

bool isSoftError(int err) {
  // ICMP errors reported on an established TCP connection (with IP_RECVERR
  // on, e.g. while probing routes): TCP keeps retrying, so do we.
  return err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN || err == ENETDOWN;
}

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string SockAddr::ip() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
  else if (family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::string SockAddr::str() const {
  return family() == AF_INET6 ? strcat("[", ip(), "]:", port()) : strcat(ip(), ":", port());
}

bool isIpLiteral(const std::string& text) {
  unsigned char buf[16];
  return inet_pton(AF_INET, text.c_str(), buf) == 1 || inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

SockAddr parseAddress(const std::string& ip, uint16_t port) {
  SockAddr a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    a.length = sizeof(sockaddr_in);
    return a;
  }
  if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    a.length = sizeof(sockaddr_in6);
    return a;
  }
  fail("'", ip, "' is not an IP address");
}

SockAddr parseEndpoint(const std::string& endpoint) {
  std::string host, port;
  if (!endpoint.empty() && endpoint[0] == '[') {
    auto close = endpoint.find(']');
    MAESTRO_CHECK(close != std::string::npos && close + 1 < endpoint.size() && endpoint[close + 1] == ':',
                  "bad endpoint '", endpoint, "'");
    host = endpoint.substr(1, close - 1);
    port = endpoint.substr(close + 2);
  } else {
    auto colon = endpoint.rfind(':');
    MAESTRO_CHECK(colon != std::string::npos, "bad endpoint '", endpoint, "' (expected ip:port)");
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  MAESTRO_CHECK(!port.empty() && end && *end == '\0' && p > 0 && p < 65536, "bad port in endpoint '",
                endpoint, "'");
  return parseAddress(host, static_cast<uint16_t>(p));
}

SockAddr localAddress(int fd) {
  SockAddr a;
  a.length = sizeof a.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0)
    fail("getsockname: ", errnoText(errno));
  return a;
}

SockAddr peerAddress(int fd) {
  SockAddr a;
  a.length = sizeof a.storage;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0)
    fail("getpeername: ", errnoText(errno));
  return a;
}

void setCloseOnExec(int fd) { fcntl(fd, F_SETFD, FD_CLOEXEC); }

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void setRtoFloor(int fd) {
  constexpr int kTcpRtoMinUs = 45;  // TCP_RTO_MIN_US (linux/tcp.h of 6.15 on; older headers lack it)
  int floor_us = kRtoFloorUs;
  (void)setsockopt(fd, IPPROTO_TCP, kTcpRtoMinUs, &floor_us, sizeof floor_us);  // EINVAL/ENOPROTOOPT on older kernels
}

namespace {
std::string procLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "?" : line;
}
}  // namespace

void setCongestion(int fd, const std::string& name, const char* knob) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) return;
  const int err = errno;
  fail(knob, "=", name, ": the kernel refuses this TCP congestion control (", errnoText(err),
       "); it has: ", procLine("/proc/sys/net/ipv4/tcp_available_congestion_control"),
       "; allowed without CAP_NET_ADMIN: ", procLine("/proc/sys/net/ipv4/tcp_allowed_congestion_control"),
       " (an algorithm built as a module that is not loaded needs root: modprobe tcp_", name, ")");
}

void checkCongestion(const std::string& name, const char* knob) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(knob, ": cannot open a socket to check it: ", errnoText(errno));
  try {
    setCongestion(fd, name, knob);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string chooseCongestion(const std::string& setting, std::string* why) {
  std::string kernel;
  std::ifstream("/proc/sys/net/ipv4/tcp_congestion_control") >> kernel;
  const std::string kernel_text = kernel.empty() ? std::string("the kernel's default") : "the kernel's default (" + kernel + ")";
  if (setting == "kernel") {
    *why = kernel_text + ", as set";
    return {};
  }
  if (setting != "auto") {
    *why = setting + ", as set";
    return setting;
  }
  if (kernel != "bbr") {
    *why = "auto: " + kernel_text;
    return {};
  }
  std::string choice = "cubic";
  try {
    checkCongestion(choice, "MAESTRO_TCP_CONGESTION");
  } catch (const Error&) {
    choice = "reno";  // every process may use it
  }
  *why = strcat("auto: ", choice, " instead of ", kernel_text,
                ", which loses heavily on shallow switch buffers (MAESTRO_TCP_CONGESTION=kernel keeps it)");
  return choice;
}

std::string congestionOf(int fd) {
  char name[32] = {};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return {};
  return std::string(name);
}

namespace {
// A TCP socket bound to `addr` (SO_REUSEADDR: a restarted job binds past
// TIME_WAIT; SO_REUSEPORT if share_port), or -1 with the bind's errno in *err.
int tryBind(const SockAddr& addr, bool share_port, int* err) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  MAESTRO_CHECK(fd >= 0, "socket: ", errnoText(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (share_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (::bind(fd, addr.get(), addr.length) == 0) return fd;
  *err = errno;
  ::close(fd);
  return -1;
}

[[noreturn]] void failBind(const char* purpose, const SockAddr& addr, int err) {
  fail("cannot ", purpose, " ", addr.str(), ": ", errnoText(err),
       err == EADDRNOTAVAIL ? " (the address is not assigned to an interface of this host/"
                              "namespace: check MAESTRO_VNICS / MAESTRO_IFNAME)"
                            : "");
}
}  // namespace

int listenOn(const std::string& ip, uint16_t port, int backlog, bool share_port) {
  SockAddr addr = parseAddress(ip, port);
  int fd = bindTo(addr, "listen on", share_port);
  if (::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    fail("listen on ", addr.str(), ": ", errnoText(err));
  }
  return fd;
}

int listenInRange(const std::string& ip, uint16_t lo, uint16_t hi, int backlog, bool share_port) {
  MAESTRO_CHECK(lo > 0 && lo <= hi, "listen on ", ip, ": bad port range ", lo, "-", hi);
  const uint32_t n = static_cast<uint32_t>(hi) - lo + 1;
  static std::atomic<uint32_t> calls{0};
  const uint32_t start = (static_cast<uint32_t>(::getpid()) * 2654435761u + calls++ * 7919u) % n;
  for (uint32_t i = 0; i < n; ++i) {
    SockAddr addr = parseAddress(ip, static_cast<uint16_t>(lo + (start + i) % n));
    // Bound without SO_REUSEPORT: the bind fails if any socket holds the
    // port, a listener of another rank or a route probe included.
    int err = 0;
    int fd = tryBind(addr, false, &err);
    if (fd >= 0 && ::listen(fd, backlog) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
    if (fd < 0) {
      if (err == EADDRINUSE) continue;
      failBind("listen on", addr, err);
    }
    // Route probes may now send from this port (they set SO_REUSEPORT too).
    int one = 1;
    if (share_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    return fd;
  }
  fail("cannot listen on ", ip, ": every port of MAESTRO_PORT_RANGE=", lo, "-", hi, " (", n,
       ") is in use on this address; each rank of this host takes one per vNIC, and each subgroup that opens its "
       "own paths one more: widen the range");
}

int connectFrom(const std::string& local_ip, const SockAddr& remote, Deadline deadline, uint16_t local_port) {
  SockAddr local = parseAddress(local_ip, local_port);
  MAESTRO_CHECK(local.family() == remote.family(), "cannot connect from ", local_ip, " to ",
                remote.str(), ": address families differ");
  int fd = ::socket(remote.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  MAESTRO_CHECK(fd >= 0, "socket: ", errnoText(errno));
  auto bail = [&](const std::string& what) {
    ::close(fd);
    fail("cannot connect ", local_ip, " -> ", remote.str(), ": ", what);
  };
  if (local_port != 0) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  }
  if (::bind(fd, local.get(), local.length) != 0) bail(strcat("bind: ", errnoText(errno)));
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  if (::connect(fd, remote.get(), remote.length) != 0) {
    if (errno != EINPROGRESS) bail(errnoText(errno));
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) bail("timed out");
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (r < 0 && errno != EINTR) bail(strcat("poll: ", errnoText(errno)));
      if (r > 0) break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) bail(errnoText(err));
  }
  fcntl(fd, F_SETFL, flags);
  return fd;
}

bool readFull(int fd, void* buf, size_t length) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < length) {
    ssize_t n = ::recv(fd, p + got, length - got, MSG_WAITALL);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (got == 0) return false;
      fail("connection closed in the middle of a message (", got, " of ", length, " bytes)");
    }
    if (errno == EINTR || isSoftError(errno)) continue;
    if (errno == ECONNRESET) fail("connection reset by the peer");
    fail("recv: ", errnoText(errno));
  }
  return true;
}

void writeFull(int fd, const void* buf, size_t length) {
  auto* p = static_cast<const uint8_t*>(buf);
  size_t sent = 0;
  while (sent < length) {
    ssize_t n = ::send(fd, p + sent, length - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || isSoftError(errno))) continue;
    fail("send: ", n < 0 ? errnoText(errno) : std::string("connection closed"));
  }
}

bool waitReadable(int fd, Deadline deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) fail("poll: ", errnoText(errno));
  }
}

int bindReusable(const SockAddr& addr, const char* purpose) { return bindTo(addr, purpose, true); }

int bindTo(const SockAddr& addr, const char* purpose, bool share_port) {
  int err = 0;
  int fd = tryBind(addr, share_port, &err);
  if (fd < 0) failBind(purpose, addr, err);
  return fd;
}

int startProbe(const SockAddr& local, const SockAddr& remote, int ttl) {
  MAESTRO_CHECK(local.family() == AF_INET && remote.family() == AF_INET, "route probes are implemented for IPv4");
  int fd = bindReusable(local);
  int on = 1;
  setsockopt(fd, IPPROTO_IP, IP_RECVERR, &on, sizeof on);
  setsockopt(fd, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (::connect(fd, remote.get(), remote.length) != 0 && errno != EINPROGRESS) {
    int err = errno;
    ::close(fd);
    // The 5-tuple is a connection already: the peer's own probe of it (the
    // other direction, sent at the same moment) reached our listener, so no
    // router lies between to expire it.
    if (err == EADDRNOTAVAIL) return -1;
    fail("probe ", local.str(), " -> ", remote.str(), ": ", errnoText(err));
  }
  return fd;
}

void closeWithReset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

std::vector<std::string> probeHops(const std::vector<std::pair<std::string, std::string>>& endpoints, int ttl,
                                   Deadline deadline, std::string* why) {
  std::vector<std::pair<SockAddr, SockAddr>> tuples;
  for (const auto& e : endpoints) tuples.emplace_back(parseEndpoint(e.first), parseEndpoint(e.second));
  return probeHops(tuples, ttl, deadline, why);
}

std::vector<std::string> probeHops(const std::vector<std::pair<SockAddr, SockAddr>>& probes, int ttl,
                                   Deadline deadline, std::string* why) {
  // Every probe is a SYN from the exact 5-tuple, sent at once; the router
  // where its TTL runs out answers "time exceeded", which the kernel queues
  // on the socket's error queue while it is connecting (IP_RECVERR).
  std::vector<std::string> hops(probes.size());
  std::vector<int> fds(probes.size(), -1);
  size_t open = 0, answered = 0, reached = 0;
  for (size_t i = 0; i < probes.size(); ++i) {
    try {
      fds[i] = startProbe(probes[i].first, probes[i].second, ttl);
      (fds[i] >= 0 ? open : reached) += 1;
    } catch (const Error& e) {
      *why = e.what();
    }
  }
  while (open > 0 && Clock::now() < deadline) {
    std::vector<pollfd> pfds;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i] >= 0) {
        pfds.push_back({fds[i], POLLOUT, 0});
        index.push_back(i);
      }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (::poll(pfds.data(), pfds.size(), static_cast<int>(std::max<long long>(1, std::min<long long>(left, 100)))) <= 0)
      continue;
    for (size_t k = 0; k < pfds.size(); ++k) {
      size_t i = index[k];
      if (pfds[k].revents & POLLERR) {
        hops[i] = readIcmpOffender(fds[i]);
        // No ICMP: refused by the peer itself (no router that far).
        (hops[i].empty() ? reached : answered) += 1;
      } else if (pfds[k].revents & POLLOUT) {
        ++reached;  // connected: the peer itself answered (no router that far)
      } else {
        continue;
      }
      closeWithReset(fds[i]);
      fds[i] = -1;
      --open;
    }
  }
  for (int fd : fds)
    if (fd >= 0) closeWithReset(fd);
  if (answered + reached < probes.size())
    *why = strcat(probes.size() - answered - reached, " of ", probes.size(),
                  " route probes got no ICMP time-exceeded answer (TTL ", ttl,
                  " beyond the routers, routers rate-limiting ICMP, or ICMP filtered)");
  return hops;
}

std::string readIcmpOffender(int fd) {
  char control[512];
  char data[64];
  iovec iov{data, sizeof data};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return "";
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_RECVERR) continue;
    auto* ee = reinterpret_cast<sock_extended_err*>(CMSG_DATA(c));
    if (ee->ee_origin != SO_EE_ORIGIN_ICMP || ee->ee_type != 11 /* ICMP_TIME_EXCEEDED */) continue;
    auto* from = reinterpret_cast<sockaddr_in*>(SO_EE_OFFENDER(ee));
    if (from->sin_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &from->sin_addr, buf, sizeof buf);
    return buf;
  }
  return "";
}

std::vector<std::string> interfaceAddresses(const std::string& ifname) {
  MAESTRO_CHECK(if_nametoindex(ifname.c_str()) != 0, "MAESTRO_IFNAME: no interface named '",
                ifname, "' in this network namespace");
  ifaddrs* list = nullptr;
  MAESTRO_CHECK(getifaddrs(&list) == 0, "getifaddrs: ", errnoText(errno));
  std::vector<std::string> v4, v6;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || ifname != it->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (it->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof buf);
      v4.push_back(buf);
    } else if (it->ifa_addr->sa_family == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;  // needs a scope id; not a vNIC
      inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
      v6.push_back(buf);
    }
  }
  freeifaddrs(list);
  // IPv4 first: that is what RoCEv2 GIDs and the lab use; the kernel lists the
  // primary address before its aliases.
  v4.insert(v4.end(), v6.begin(), v6.end());
  MAESTRO_CHECK(!v4.empty(), "MAESTRO_IFNAME: interface '", ifname, "' has no IP addresses");
  return v4;
}

std::string sourceAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  MAESTRO_CHECK(rc == 0 && res, "cannot resolve '", host, "': ", gai_strerror(rc));
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    fail("socket: ", errnoText(errno));
  }
  // A UDP connect sends nothing; it only asks the kernel for a route.
  int c = ::connect(fd, res->ai_addr, res->ai_addrlen);
  int err = errno;
  freeaddrinfo(res);
  if (c != 0) {
    ::close(fd);
    fail("no route to '", host, "': ", errnoText(err));
  }
  SockAddr local = localAddress(fd);
  ::close(fd);
  return local.ip();
}

bool isLoopbackAddress(const std::string& ip) {
  in_addr v4{};
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, ip.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

bool isLocalAddress(const std::string& ip) {
  try {
    int fd = listenOn(ip, 0, 1);
    ::close(fd);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string hostIdentity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat st {};
  std::string netns = stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : "?";
  return strcat(host, "/", boot, "/netns:", netns);
}

void reserveDescriptors(size_t more, const std::string& what) {
  size_t open = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(dir)) open += e->d_name[0] != '.';
    ::closedir(dir);
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t needed = static_cast<rlim_t>(open + more);
  if (limit.rlim_cur == RLIM_INFINITY || needed <= limit.rlim_cur) return;
  if (limit.rlim_max == RLIM_INFINITY || needed <= limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? needed : limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      MAESTRO_INFO("raised the soft descriptor limit (RLIMIT_NOFILE) from ", limit.rlim_cur, " to ",
                   raised.rlim_cur, " for ", what);
      return;
    }
  }
  fail(what, " needs ", more, " more file descriptors, but ", open, " are open and the limit (RLIMIT_NOFILE) is ",
       limit.rlim_cur, " (hard limit ", limit.rlim_max, "): raise it to at least ", needed,
       " (ulimit -n, LimitNOFILE= in a systemd unit, --ulimit nofile= for a container)");
}

}  // namespace net
}  // namespace maestro
