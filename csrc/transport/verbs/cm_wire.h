// What travels in rdma_cm's private data, and address plumbing for rdma_cm.
//
// The Hello rides in the connect request: rdma_cm exchanges QP numbers, PSNs
// and GIDs itself, so the only thing maestro adds is the hello, and the
// accepting side can check it *before* it creates anything or accepts. An RC
// connect request over IB CM (which RoCE uses) leaves 56 bytes of private
// data to the consumer: magic (4) + secret (32) + rank (4) + path (4) fit.
// A rejection carries a short text reason back, so the connecting side can
// tell "wrong secret" (give up at once) from "nobody listens yet" (retry).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace verbs {

constexpr size_t kMaxConnectPrivateData = 56;
constexpr size_t kHelloWireBytes = 4 + Hello::kSecretBytes + 4 + 4;
static_assert(kHelloWireBytes <= kMaxConnectPrivateData, "hello must fit rdma_cm's private data");

void encodeHello(const Hello& hello, uint8_t out[kHelloWireBytes]);
// False when the data is too short or not a maestro hello. The received
// private data may be longer than what was sent (zero padding).
bool decodeHello(const void* data, size_t length, Hello* out);
// Constant-time comparison of two secrets, so timing does not leak how many
// leading bytes of a guess were right.
bool secretsEqual(const uint8_t* a, const uint8_t* b);

// A reject message: a tagged, NUL-terminated reason (truncated to fit).
std::string encodeReject(const std::string& reason);
// True (and the reason) when the private data of a REJECTED event is ours;
// false when the rejection came from rdma_cm itself (e.g. no listener).
bool decodeReject(const void* data, size_t length, std::string* reason);

// "ip:port" or "[ipv6]:port" -> (ip, port). Throws maestro::Error.
void splitEndpoint(const std::string& endpoint, std::string* ip, uint16_t* port);
// An IP literal and a port -> socket address. Throws maestro::Error.
void makeSockaddr(const std::string& ip, uint16_t port, sockaddr_storage* out);
// Socket address -> "ip:port" ("[ip]:port" for IPv6).
std::string sockaddrToString(const sockaddr* addr);
// Socket address -> "ip" only.
std::string sockaddrIp(const sockaddr* addr);

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
