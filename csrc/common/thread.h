// Naming the threads maestro starts, so `top -H`, gdb and /proc/<pid>/task
// show which is which (Linux allows 15 characters).
#pragma once

#include <pthread.h>

#include <string>
#include <thread>
#include <utility>

namespace maestro {

inline void nameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// Starts fn on a thread that carries `name` by the time this returns. A new
// thread has its creator's name until it is renamed, so a thread that named
// itself could still show the creator's name after its start had returned,
// and a count of the process's maestro-* threads would miss it.
template <typename Fn>
std::thread startNamedThread(const std::string& name, Fn&& fn) {
  std::thread t(std::forward<Fn>(fn));
  pthread_setname_np(t.native_handle(), name.substr(0, 15).c_str());
  return t;
}

}  // namespace maestro
