#include "transport/tcp/frame.h"

#include "common/error.h"
#include "common/secret.h"
#include "transport/tcp/same_host.h"
#include "transport/transport.h"

namespace maestro {
namespace transport {
namespace tcp {

std::string checkHeader(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return strcat("bad frame magic 0x", std::hex, h.magic);
  if (h.reserved != 0) return "reserved header bits set";
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kWrite:
      if ((h.flags & ~(kFlagImm | kFlagByReference)) != 0) return strcat("unknown WRITE flags 0x", std::hex, int(h.flags));
      if (h.length > kMaxWritePayload)
        return strcat("WRITE of ", h.length, " bytes exceeds the ", kMaxWritePayload, "-byte frame limit");
      return "";
    case FrameType::kSend:
      if (h.flags != 0 || h.region != 0 || h.imm != 0 || h.key != 0 || h.offset != 0)
        return "SEND frame with WRITE fields set";
      if (h.length > kMaxControlBytes)
        return strcat("SEND of ", h.length, " bytes exceeds the ", kMaxControlBytes, "-byte control limit");
      return "";
    case FrameType::kAck:
      if (h.flags != 0 || h.region != 0 || h.imm != 0 || h.key != 0 || h.length != 0)
        return "ACK frame with payload fields set";
      return "";
    case FrameType::kOffer:
      if (h.flags != 0 || h.region != 0 || h.imm != 0 || h.key != 0 || h.offset != 0)
        return "OFFER frame with WRITE fields set";
      if (h.length != sizeof(same_host::Offer))
        return strcat("OFFER of ", h.length, " bytes, not ", sizeof(same_host::Offer));
      return "";
    case FrameType::kAccept:
      if (h.flags != 0 || h.region != 0 || h.imm != 0 || h.key != 0 || h.offset != 0 || h.length != 0)
        return "ACCEPT frame with fields set";
      return "";
    case FrameType::kMark:
      if (h.flags != 0 || h.region != 0 || h.imm != 0 || h.key != 0 || h.length != 0)
        return "MARK frame with payload fields set";
      return "";
  }
  return strcat("unknown frame type ", int(h.type));
}

FrameHeader writeFrame(uint32_t region, uint64_t key, uint64_t offset, uint64_t length, bool with_imm,
                       uint32_t imm) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kWrite);
  h.flags = with_imm ? kFlagImm : 0;
  h.region = region;
  h.imm = with_imm ? imm : 0;
  h.key = key;
  h.offset = offset;
  h.length = length;
  return h;
}

FrameHeader sendFrame(uint64_t length) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kSend);
  h.length = length;
  return h;
}

FrameHeader offerFrame() {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kOffer);
  h.length = sizeof(same_host::Offer);
  return h;
}

FrameHeader acceptFrame() {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kAccept);
  return h;
}

FrameHeader markFrame(uint64_t mark) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kMark);
  h.offset = mark;
  return h;
}

FrameHeader ackFrame(uint64_t writes_received) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kAck);
  h.offset = writes_received;
  return h;
}

HelloStatus checkHello(const HelloWire& hello, const uint8_t* secret, size_t secret_len, int my_rank,
                       int world_size) {
  if (hello.magic != kHelloMagic) return HelloStatus::kBadMagic;
  if (hello.version != kProtocolVersion) return HelloStatus::kBadVersion;
  if (secret_len != sizeof hello.secret || !sameSecret(hello.secret, secret, secret_len)) return HelloStatus::kBadSecret;
  if (hello.rank < 0 || hello.rank >= world_size || hello.rank == my_rank) return HelloStatus::kBadRank;
  if (hello.path < 0 || hello.path >= kMaxPaths) return HelloStatus::kBadPath;
  return HelloStatus::kOk;
}

const char* helloStatusText(HelloStatus status) {
  switch (status) {
    case HelloStatus::kOk: return "ok";
    case HelloStatus::kBadMagic: return "not a maestro connection";
    case HelloStatus::kBadVersion: return "protocol version mismatch (different maestro versions?)";
    case HelloStatus::kBadSecret: return "wrong group secret (a connection from outside this process group)";
    case HelloStatus::kBadRank: return "rank out of range";
    case HelloStatus::kBadPath: return "path index out of range";
    case HelloStatus::kDuplicate: return "this path is already connected";
    case HelloStatus::kBadAddress: return "not from the address that rank published for this path";
  }
  return "unknown status";
}

}  // namespace tcp
}  // namespace transport
}  // namespace maestro
