// Errors. Every failure the user can see is a maestro::Error whose message
// says what went wrong and, where it helps, what to do about it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace maestro {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A collective did not finish in time.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

namespace detail {
inline void streamAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void streamAll(std::ostringstream& os, T&& first, Rest&&... rest) {
  os << std::forward<T>(first);
  streamAll(os, std::forward<Rest>(rest)...);
}
}  // namespace detail

template <typename... Args>
std::string strcat(Args&&... args) {
  std::ostringstream os;
  detail::streamAll(os, std::forward<Args>(args)...);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(strcat(std::forward<Args>(args)...));
}

}  // namespace maestro

// MAESTRO_CHECK(cond, "message parts", ...): throw maestro::Error unless cond.
#define MAESTRO_CHECK(cond, ...)              \
  do {                                        \
    if (!(cond)) ::maestro::fail(__VA_ARGS__); \
  } while (0)
