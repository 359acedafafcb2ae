// The TCP transport's wire format. Every frame starts with a fixed 40-byte
// header; WRITE and SEND frames are followed by `length` payload bytes.
//
//   WRITE  one-sided write: payload lands at (region, offset), checked against
//          the receiver's region table; kFlagImm makes the receiver raise a
//          completion carrying `imm` (RDMA WRITE WITH IMM).
//   SEND   two-sided control message (<= kMaxControlBytes), copied out.
//   ACK    `offset` = cumulative count of WRITE frames fully received on this
//          connection; the sender completes its writes in order (RC ACK).
//   OFFER  same_host::Offer follows (`length` = its size): the sender's
//          pid, cookie and liveness word, for single copy (same_host.h).
//   ACCEPT the receiver verified the offer: WRITEs may now carry
//          kFlagByReference.
//   MARK   `offset` = a fence mark: every WRITE the sender withdrew from this
//          connection went before it (TcpPath::withdraw()). The receiver
//          drops WRITEs while it has been told of a later mark than the last
//          one it read here (TcpPath::dropUntil()). A mark is the
//          connection's number from the hello (its low 48 bits) << 16 | the
//          count of its sender's fences.
//
// A WRITE with kFlagByReference is followed by 8 bytes, the payload's
// address in the sender's memory, instead of `length` payload bytes; the
// receiver copies the payload from there (same_host.h).
//
// All integers are little-endian (the static_assert below pins the host
// order rather than byte-swapping on every frame).
#pragma once

#include <cstdint>
#include <string>

namespace maestro {
namespace transport {
namespace tcp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP wire format assumes a little-endian host");

constexpr uint32_t kFrameMagic = 0x5254534d;  // "MSTR"
constexpr uint32_t kHelloMagic = 0x4c45484d;  // "MHEL"
constexpr uint16_t kProtocolVersion = 2;

enum class FrameType : uint8_t { kWrite = 1, kSend = 2, kAck = 3, kOffer = 4, kAccept = 5, kMark = 6 };
constexpr uint8_t kFlagImm = 1;
constexpr uint8_t kFlagByReference = 2;

// Upper bound for one WRITE frame's payload: a chunk, never a whole tensor.
constexpr uint64_t kMaxWritePayload = 64ull << 20;
constexpr int32_t kMaxPaths = 1024;  // path indices a hello may name

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint16_t reserved = 0;
  uint32_t region = 0;
  uint32_t imm = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 40, "FrameHeader is a wire format");

// Checks what can be checked from the header alone. Returns "" when the
// header is well formed, else the reason (used in the path error).
std::string checkHeader(const FrameHeader& h);

FrameHeader writeFrame(uint32_t region, uint64_t key, uint64_t offset, uint64_t length, bool with_imm,
                       uint32_t imm);
FrameHeader sendFrame(uint64_t length);
FrameHeader ackFrame(uint64_t writes_received);
FrameHeader offerFrame();
FrameHeader acceptFrame();
FrameHeader markFrame(uint64_t mark);
// A fence mark: the connection's number (from the hello) in the top 48
// bits, so that a fence meant for a connection the path has since replaced
// is told apart; the count of this side's fences below.
constexpr int kFenceBits = 16;
inline uint64_t markOf(uint64_t connection, uint64_t fences) { return (connection << kFenceBits) | fences; }
// The count of a failed connection's last fence: no MARK carries it, so its
// peer drops every write still arriving on that connection.
constexpr uint64_t kClosedFence = (uint64_t{1} << kFenceBits) - 1;
inline bool sameConnection(uint64_t mark, uint64_t connection) {
  return (mark >> kFenceBits) == (connection & ((uint64_t{1} << (64 - kFenceBits)) - 1));
}

// Connection handshake: the connecting side sends HelloWire, the accepting
// side answers HelloReply and closes the connection unless status is kOk.
struct HelloWire {
  uint32_t magic = kHelloMagic;
  uint16_t version = kProtocolVersion;
  uint16_t reserved = 0;
  uint8_t secret[32] = {};
  int32_t rank = -1;
  int32_t path = -1;
  // Drawn at random by the connecting side: names this connection in the
  // fence marks of both sides (TcpPath::withdraw()), so that a fence meant
  // for a connection the path has since replaced holds nothing back.
  uint64_t connection = 0;
};
static_assert(sizeof(HelloWire) == 56, "HelloWire is a wire format");

enum class HelloStatus : uint32_t {
  kOk = 0,
  kBadMagic = 1,
  kBadVersion = 2,
  kBadSecret = 3,
  kBadRank = 4,
  kBadPath = 5,
  kDuplicate = 6,
  kBadAddress = 7,
};
// The answer to a hello, from its content alone (where it came from is
// the transport's to check): magic, version, secret (compared in constant
// time), rank within the world and not ours, path index.
HelloStatus checkHello(const HelloWire& hello, const uint8_t* secret, size_t secret_len, int my_rank,
                       int world_size);
struct HelloReply {
  uint32_t magic = kHelloMagic;
  uint32_t status = 0;
};
static_assert(sizeof(HelloReply) == 8, "HelloReply is a wire format");

const char* helloStatusText(HelloStatus status);

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
