// ibv_reg_mr with an error message that says what to do.
//
// Registration pins the pages, and the pinned total is capped by the
// RLIMIT_MEMLOCK of the process (64 KiB to 8 MiB by default on most
// distributions, far below a model's gradients). When it is exceeded the
// kernel answers ENOMEM (or EPERM), which on its own reads like an
// out-of-memory condition; the message names the real cause and the fix.
#pragma once

#include <cstddef>

struct ibv_mr;
struct ibv_pd;

namespace maestro {
namespace transport {
namespace verbs {

// Registers [addr, addr+length) with `access` (IBV_ACCESS_* flags); throws
// maestro::Error on failure. `what` names the buffer in the message.
ibv_mr* registerOrExplain(ibv_pd* pd, void* addr, size_t length, int access, const char* what);

}  // namespace verbs
}  // namespace transport
}  // namespace maestro
