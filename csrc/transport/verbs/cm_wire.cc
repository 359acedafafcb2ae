#include "transport/verbs/cm_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "common/error.h"
#include "common/secret.h"

namespace maestro {
namespace transport {
namespace verbs {
namespace {

// "MHL1": maestro hello, layout version 1.
constexpr uint32_t kHelloMagic = 0x4d484c31;
constexpr char kRejectTag[] = "maestro-reject:";
// IB CM carries up to 148 bytes with a REJ; stay well inside it.
constexpr size_t kMaxRejectBytes = 96;

}  // namespace

void encodeHello(const Hello& hello, uint8_t out[kHelloWireBytes]) {
  const uint32_t magic = htonl(kHelloMagic);
  const uint32_t rank = htonl(static_cast<uint32_t>(hello.rank));
  const uint32_t path = htonl(static_cast<uint32_t>(hello.path));
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, hello.secret, Hello::kSecretBytes);
  std::memcpy(out + 4 + Hello::kSecretBytes, &rank, 4);
  std::memcpy(out + 8 + Hello::kSecretBytes, &path, 4);
}

bool decodeHello(const void* data, size_t length, Hello* out) {
  if (data == nullptr || length < kHelloWireBytes) return false;
  const auto* in = static_cast<const uint8_t*>(data);
  uint32_t magic, rank, path;
  std::memcpy(&magic, in, 4);
  if (ntohl(magic) != kHelloMagic) return false;
  std::memcpy(out->secret, in + 4, Hello::kSecretBytes);
  std::memcpy(&rank, in + 4 + Hello::kSecretBytes, 4);
  std::memcpy(&path, in + 8 + Hello::kSecretBytes, 4);
  out->rank = static_cast<int32_t>(ntohl(rank));
  out->path = static_cast<int32_t>(ntohl(path));
  return true;
}

bool secretsEqual(const uint8_t* a, const uint8_t* b) { return sameSecret(a, b, Hello::kSecretBytes); }

std::string encodeReject(const std::string& reason) {
  std::string msg = std::string(kRejectTag) + reason;
  if (msg.size() > kMaxRejectBytes - 1) msg.resize(kMaxRejectBytes - 1);
  msg.push_back('\0');
  return msg;
}

bool decodeReject(const void* data, size_t length, std::string* reason) {
  const size_t tag_len = sizeof(kRejectTag) - 1;
  if (data == nullptr || length < tag_len) return false;
  const char* text = static_cast<const char*>(data);
  if (std::memcmp(text, kRejectTag, tag_len) != 0) return false;
  // The received buffer may be padded and need not be NUL-terminated.
  *reason = std::string(text + tag_len, strnlen(text + tag_len, length - tag_len));
  return true;
}

void splitEndpoint(const std::string& endpoint, std::string* ip, uint16_t* port) {
  const size_t colon = endpoint.rfind(':');
  MAESTRO_CHECK(colon != std::string::npos && colon + 1 < endpoint.size(),
                "verbs: endpoint '", endpoint, "' is not ip:port");
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const unsigned long value = std::strtoul(endpoint.c_str() + colon + 1, &end, 10);
  MAESTRO_CHECK(end != nullptr && *end == '\0' && value <= 65535, "verbs: endpoint '", endpoint,
                "' has no valid port");
  *ip = host;
  *port = static_cast<uint16_t>(value);
}

void makeSockaddr(const std::string& ip, uint16_t port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  MAESTRO_CHECK(inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1, "verbs: '", ip,
                "' is not an IP address literal");
  v6->sin6_family = AF_INET6;
  v6->sin6_port = htons(port);
}

std::string sockaddrIp(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

std::string sockaddrToString(const sockaddr* addr) {
  if (addr->sa_family == AF_INET6) {
    return strcat("[", sockaddrIp(addr), "]:", ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port));
  }
  return strcat(sockaddrIp(addr), ":", ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port));
}

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
