// libFuzzer target: the hello a TCP connection presents, as the accepting
// side checks it (checkHello). The first byte picks whether the group's real
// secret is put in, so the checks after the secret are reached too.
#include <cstdint>
#include <cstring>

#include "transport/tcp/frame.h"

using maestro::transport::tcp::checkHello;
using maestro::transport::tcp::HelloStatus;
using maestro::transport::tcp::HelloWire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint8_t secret[32];
  for (size_t i = 0; i < sizeof secret; ++i) secret[i] = static_cast<uint8_t>(i * 29 + 7);
  HelloWire hello;
  std::memset(&hello, 0, sizeof hello);
  std::memcpy(&hello, data + 1, std::min(size - 1, sizeof hello));
  if (data[0] & 1) std::memcpy(hello.secret, secret, sizeof secret);
  const int world = 1 + (data[0] >> 1) % 64;
  HelloStatus s = checkHello(hello, secret, sizeof secret, 0, world);
  if (s == HelloStatus::kOk && (hello.rank <= 0 || hello.rank >= world || hello.path < 0)) __builtin_trap();
  return 0;
}
