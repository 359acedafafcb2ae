#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace maestro {
namespace {

LogLevel levelFromEnv() {
  const char* env = std::getenv("MAESTRO_DEBUG");
  if (env == nullptr || *env == '\0') return LogLevel::kWarn;
  try {
    return parseLogLevel(env);
  } catch (const Error&) {
    return LogLevel::kWarn;  // Config reports the bad value with a clear error.
  }
}

std::atomic<int>& levelStore() {
  static std::atomic<int> level{static_cast<int>(levelFromEnv())};
  return level;
}

thread_local int tlsRank = -1;
// For threads that never set one (transport threads): the rank last set by
// any thread, which in the usual one-rank-per-process run is the rank.
std::atomic<int> processRank{-1};

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}

}  // namespace

LogLevel logLevel() { return static_cast<LogLevel>(levelStore().load(std::memory_order_relaxed)); }

void setLogLevel(LogLevel level) { levelStore().store(static_cast<int>(level)); }

LogLevel parseLogLevel(const std::string& text) {
  std::string t;
  for (char c : text) t.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (t == "NONE" || t == "OFF") return LogLevel::kNone;
  if (t == "WARN" || t == "WARNING") return LogLevel::kWarn;
  if (t == "INFO") return LogLevel::kInfo;
  if (t == "TRACE" || t == "DEBUG") return LogLevel::kTrace;
  fail("MAESTRO_DEBUG='", text, "' is not one of NONE, WARN, INFO, TRACE");
}

void setLogRank(int rank) {
  tlsRank = rank;
  processRank.store(rank, std::memory_order_relaxed);
}

void logLine(LogLevel level, const std::string& line) {
  static std::mutex mu;
  const int rank = tlsRank >= 0 ? tlsRank : processRank.load(std::memory_order_relaxed);
  std::string prefix = rank >= 0 ? strcat("maestro[", rank, "] ") : std::string("maestro ");
  std::lock_guard<std::mutex> lock(mu);
  // One write per line keeps the lines of concurrent ranks from interleaving.
  std::string out = prefix + levelName(level) + " " + line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

}  // namespace maestro
