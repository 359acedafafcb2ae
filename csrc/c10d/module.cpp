// maestro_torch._C: the backend class for torch.distributed, and the knob
// table for the Python package (declared once, in common/config.cc).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include "c10d/backend.hpp"
#include "collectives/p2p.h"
#include "collectives/tuner.h"
#include "common/config.h"
#include "common/net.h"
#include "multipath/decomposer.h"
#include "multipath/engine.h"

namespace py = pybind11;

namespace maestro {
namespace c10d_glue {
namespace {

py::list pathStatsToPython(const std::vector<multipath::PathStats>& stats) {
  py::list out;
  for (const auto& s : stats) {
    py::dict d;
    d["peer"] = s.peer;
    d["path"] = s.path;
    d["state"] = s.state;
    d["addresses"] = s.description;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["chunks_sent"] = s.chunks_sent;
    d["chunks_received"] = s.chunks_received;
    d["errors"] = s.errors;
    d["resent"] = s.resent;
    d["throughput_bps"] = s.throughput;
    d["chunk_time_s"] = s.completion_time;
    d["rtt_s"] = s.rtt;
    d["last_error"] = s.last_error;
    d["route"] = s.route;
    d["reconnects"] = s.reconnects;
    d["hunts"] = s.hunts;
    py::dict nic;
    for (const auto& kv : s.nic_counters) nic[py::str(kv.first)] = kv.second;
    d["nic_counters"] = nic;
    d["congestion"] = s.congestion;
    py::dict own;
    for (const auto& kv : s.path_counters) own[py::str(kv.first)] = kv.second;
    d["path_counters"] = own;
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace c10d_glue
}  // namespace maestro

PYBIND11_MODULE(_C, m) {
  using maestro::c10d_glue::ProcessGroupMaestro;
  m.doc() = "maestro: multi-path collective backend for torch.distributed (C++ core)";
  // The base class (c10d::Backend) must be registered with pybind first.
  py::module::import("torch.distributed");

  py::class_<ProcessGroupMaestro, ::c10d::Backend, c10::intrusive_ptr<ProcessGroupMaestro>>(m, "ProcessGroupMaestro")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::map<std::string, std::string>& options,
                       const std::vector<int64_t>& global_ranks) {
             return c10::make_intrusive<ProcessGroupMaestro>(store, rank, size, timeout, options, global_ranks);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("options"),
           py::arg("global_ranks") = std::vector<int64_t>(),
           py::call_guard<py::gil_scoped_release>())
      .def("path_stats",
           [](const ProcessGroupMaestro& pg) { return maestro::c10d_glue::pathStatsToPython(pg.pathStats()); })
      .def("describe", &ProcessGroupMaestro::describe)
      .def("dump_json", &ProcessGroupMaestro::dumpJson, py::call_guard<py::gil_scoped_release>(),
           "The group's flight record as JSON: its last operations (state, times, error) and every path's "
           "counters")
      .def("registration_cache_stats", &ProcessGroupMaestro::cacheStats)
      .def("staging_stats", &ProcessGroupMaestro::stagingStats,
           "the staging pool: slabs kept, their bytes, slabs allocated so far (MAESTRO_STAGING)")
      .def("chunk_times", &ProcessGroupMaestro::chunkTimes, py::arg("clear") = false,
           "completion times (post to ACK, seconds) of this rank's most recent chunks")
      .def_property_readonly("transport", &ProcessGroupMaestro::transportName)
      .def_property_readonly("paths", &ProcessGroupMaestro::paths)
      .def_property_readonly("channel", &ProcessGroupMaestro::channel,
                             "the group's channel on the paths it shares with the default group (0: paths of its own)");

  // The torch this module was compiled against (its headers' version): its C++
  // ABI is tied to that release, so maestro_torch refuses to load under another
  // torch and scripts/env.sh rebuilds when they differ.
  m.attr("torch_version") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                            std::to_string(TORCH_VERSION_PATCH);
#ifdef MAESTRO_HAVE_VERBS
  m.attr("has_verbs") = true;
#else
  m.attr("has_verbs") = false;
#endif
  // Whether CUDA tensors are staged (built against a torch with CUDA).
  m.attr("has_cuda") = maestro::c10d_glue::stagingHasCuda();
  m.def("_abort_all_at_exit", &ProcessGroupMaestro::abortAllAtExit, py::call_guard<py::gil_scoped_release>(),
        "Abort every maestro group of this process still alive (registered with atexit): the peers get a "
        "goodbye, not a crash. Returns how many.");
  m.def("knobs", [] {
    using namespace pybind11::literals;
    py::list out;
    for (const auto& k : maestro::knobs())
      out.append(py::dict("name"_a = k.name, "env"_a = k.env, "default"_a = k.default_value, "doc"_a = k.doc,
                          "group_wide"_a = k.group_wide));
    return out;
  });
  // Sizes and counts the docs quote, from where the code declares them
  // (tests/python/test_docs.py holds the docs to them).
  m.def(
      "_constants",
      [] {
        using namespace pybind11::literals;
        const size_t tcp_chunk = maestro::chunkSizeFor("tcp");
        return py::dict("tcp_chunk_bytes"_a = tcp_chunk, "verbs_chunk_bytes"_a = maestro::chunkSizeFor("verbs"),
                        "tcp_min_chunk_bytes"_a = maestro::minChunkFor("tcp", tcp_chunk),
                        "small_reduce_bytes"_a = maestro::collectives::kSmallReduceBytes,
                        "direct_reduce_bytes"_a = maestro::collectives::kDirectReduceBytes,
                        "recursive_doubling_bytes_across_hosts"_a =
                            maestro::collectives::kRecursiveDoublingAcrossHosts,
                        "recursive_doubling_bytes_one_host"_a = maestro::collectives::kRecursiveDoublingOneHost,
                        "eager_slots"_a = maestro::collectives::PointToPoint::kEagerSlots,
                        "groups_sharing_paths"_a = maestro::multipath::kMaxChannels - 1,
                        "path_knobs"_a = maestro::multipath::Engine::pathKnobs());
      },
      "Sizes and counts the docs quote: the automatic chunk sizes, the smallest chunk of a mid-size TCP "
      "message, the largest reduce sent straight to its root, the largest allreduce by recursive doubling, "
      "the slots a receiver lends each sender for eager messages, how many groups share the default group's "
      "paths, the knobs that must match for a subgroup to share them.");
  // For `python -m maestro_torch.doctor`: the checks maestro itself makes,
  // not a second copy of them.
  m.def(
      "_probe_hops",
      [](const std::vector<std::pair<std::string, std::string>>& endpoints, int ttl, double timeout_s) {
        std::string why;
        auto deadline = maestro::Clock::now() + std::chrono::duration_cast<maestro::Clock::duration>(
                                                    std::chrono::duration<double>(timeout_s));
        std::vector<std::string> hops = maestro::net::probeHops(endpoints, ttl, deadline, &why);
        return std::make_pair(hops, why);
      },
      py::arg("endpoints"), py::arg("ttl"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "TTL-limited SYNs from each (local 'ip:port', remote 'ip:port'), as discovery sends them: the router "
      "`ttl` hops out on each one's route ('' where none answered), and why answers are missing.");
  m.def(
      "_congestion_choice",
      [](const std::string& setting) {
        std::string why;
        std::string choice = maestro::net::chooseCongestion(setting, &why);
        return std::make_pair(choice, why);
      },
      py::arg("setting"),
      "The TCP congestion control a MAESTRO_TCP_CONGESTION setting gives the paths ('' = the kernel's "
      "default), and why.");
  m.def(
      "resolve_config",
      [](const std::map<std::string, std::string>& options) {
        maestro::Config c = maestro::Config::resolve(options);
        std::map<std::string, std::string> values;
        for (const auto& k : maestro::knobs()) values[k.name] = k.show(c);
        return values;
      },
      py::arg("options") = std::map<std::string, std::string>{},
      "Resolve the knobs (defaults < MAESTRO_* environment < options) and return their values; raises on bad ones.");
}
