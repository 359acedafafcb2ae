"""What the torch suite harness runs, skips and expects, each entry with its
reason. Both backends get the same selection: an entry here changes gloo's
run exactly as it changes maestro's (FEATURES excepted).

FEATURES     the feature sets of distributed_test maestro joins.
SKIP         tests the harness does not run, on either backend. Each is
             counted as skipped, never as passed.
LIFT         tests distributed_test.py gates on the backend's *name* (e.g.
             BACKEND != "gloo", require_backend_is_available({"gloo"})) for
             a feature maestro documents (README.md, "Supported
             operations"). Feature sets cannot open such a gate, so the
             harness lifts it: the test runs on both backends, unmodified.
             A lift applies only while the test's skip reason is exactly the
             gate named here; any other skip stays in force.
KNOWN_GAPS   tests gloo passes and maestro fails for a known reason in
             maestro (or in how torch treats plugin backends). They still
             run and are still counted as failures; the CI check accepts
             their failure, and fails once one passes so the entry is
             removed.
CI_SUBSET    the tests tests/python/test_torch_suite.py runs in CI.
NOT_REACHED  what distributed_test.py does not exercise here (for the doc).
"""
from __future__ import annotations

# The DistTestCases.backend_feature sets maestro joins, i.e. what it
# implements in distributed_test's vocabulary (README.md, "Supported
# operations"): it is a plugin backend (without "plugin",
# require_backend_is_available() calls it unavailable), DDP works, and
# new_group() makes subgroups. "gpu" and "cuda" stand for CUDA tensors on a
# GPU per rank, which the hosts this harness runs on lack: it joins neither
# (scripts/gpu_check.sh tests maestro's CUDA staging on a GPU). skip_collective (what a backend
# lacks) is left alone: maestro implements reduce, all_gather_coalesced, recv
# from any source and the CPU barrier.
FEATURES = ("plugin", "ddp", "subgroup")

# name -> reason. Empty reasons are refused by test_torch_suite.py.
SKIP: dict[str, str] = {
}

# name -> (gate: the skip reason the gate gives, "{backend}" for the backend's
#          name; why maestro qualifies; body_backend: the BACKEND the test's
#          body sees, or None).
# body_backend "gloo": the body reads BACKEND only to choose between its CPU
# branch (taken for "gloo"/"mpi") and its CUDA branch; the process group it
# runs on is still the one made with the real backend.
_FUTURE = "get_future is only supported on mpi, nccl and gloo"
_ONLY_GLOO = "Test requires backend {backend} to be one of {{'gloo'}}"
_GPU_SET = "Test requires backend {backend} to be one of {{"
_MPI_A2A_SINGLE = "Only MPI supports CPU all_to_all_single"
_MPI_A2A = "Only MPI supports all_to_all"
LIFT: dict[str, tuple[str, str, str | None]] = {
    **{name: (_FUTURE, "Work.get_future() is implemented (DDP comm hooks use it)", "gloo")
       for name in ("test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
                    "test_accumulate_gradients_no_sync_allreduce_hook",
                    "test_accumulate_gradients_no_sync_allreduce_with_then_hook")},
    "test_get_future": (_FUTURE, "Work.get_future() is implemented", None),
    **{f"test_all_reduce_coalesced_{g}{op}": (_ONLY_GLOO, "all_reduce_coalesced is supported", None)
       for g in ("", "full_group_") for op in ("sum", "product", "min", "max")},
    "test_barrier_timeout_global": ("Only gloo backend supports timeouts",
                                    "a collective that does not finish within the group's timeout raises", None),
    "test_barrier_timeout_full_group": ("Only gloo backend supports timeouts",
                                        "a collective that does not finish within the group's timeout raises", None),
    "test_batch_isend_irecv_gloo": ("GLOO Batch Send Recv CPU", "batch_isend_irecv on CPU tensors is supported", None),
    "test_batch_isend_irecv_gloo_tags": ("GLOO Batch Send Recv CPU", "batch_isend_irecv with tags is supported", None),
    "test_grads_same_across_ranks_with_no_sync": (_ONLY_GLOO, "DDP on CPU (no_sync, find_unused_parameters)", None),
    "test_monitored_barrier_gloo": (_ONLY_GLOO, "monitored_barrier is supported", None),
    "test_monitored_barrier_gloo_rank_0_timeout": (_ONLY_GLOO, "monitored_barrier is supported", None),
    "test_monitored_barrier_gloo_subgroup": (_ONLY_GLOO, "monitored_barrier is supported", None),
    "test_scatter_object_list": (_ONLY_GLOO, "scatter_object_list is supported", None),
    # Gated on the "gpu" feature set, but on a host without CUDA they run on
    # CPU tensors only (gloo passes them here): object collectives.
    "test_all_gather_object_default_pg": (_GPU_SET, "all_gather_object is supported (CPU tensors)", None),
    "test_all_gather_object_subgroup": (_GPU_SET, "all_gather_object is supported (CPU tensors)", None),
    # Gated to MPI, which no longer is the only CPU backend with all-to-all:
    # lifted on gloo too, so these compare maestro with gloo like the rest.
    **{name: (_MPI_A2A_SINGLE, "all_to_all_single with any split sizes is supported", None)
       for name in ("test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_full_group",
                    "test_all_to_all_single_equal_split_group", "test_all_to_all_single_unequal_split",
                    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_single_unequal_split_group",
                    "test_all_to_all_single_equal_split_complex", "test_all_to_all_single_unequal_split_complex")},
    **{name: (_MPI_A2A, "all_to_all is supported", None)
       for name in ("test_all_to_all", "test_all_to_all_full_group", "test_all_to_all_group",
                    "test_all_to_all_complex")},
}

# name -> (category, the c10d call involved, cause).
_DDP_NAME = ("torch: a plugin backend is \"custom\" in DDP's logging data",
             "ProcessGroup::getBackendName() (torch's, not the backend's)",
             "DDP's logger records the process group's name, which torch derives from its BackendType; every "
             "plugin backend is BackendType::CUSTOM, hence \"custom\" where the test expects "
             "dist.get_backend() (\"maestro\"). ProcessGroupMaestro::getBackendName() is not consulted, "
             "and torch has no BackendType for an out-of-tree backend: a backend cannot change this.")
KNOWN_GAPS: dict[str, tuple[str, str, str]] = {
    "test_ddp_logging_data_cpu": _DDP_NAME,
    # Skipped on maestro by the test itself (a skip is a regression like a
    # failure unless listed here).
    "test_sparse_all_reduce_sum": (
        "maestro: no sparse allreduce", "ProcessGroupMaestro::allreduce_sparse (not overridden)",
        "maestro reduces dense tensors only; the test runs on gloo alone (\"Only Gloo backend supports sparse "
        "all reduce\")."),
}

# About a fifth of what runs on CPU, from every family: each collective and
# reduce op, complex dtypes, full-group variants, point to point with tags,
# any source and the profiler, object collectives, subgroups, futures, DDP,
# the group timeout's and monitored_barrier's error texts. About 30 s per
# backend on two cores.
CI_SUBSET: list[str] = [
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_product", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_all_reduce_full_group_min", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_reduce_sum", "test_reduce_full_group_product", "test_reduce_sum_twice",
    "test_broadcast", "test_broadcast_full_group",
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_gather", "test_gather_checks", "test_scatter", "test_scatter_checks", "test_scatter_complex",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_barrier",
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo_tags", "test_send_recv_torch_profiler", "test_isend_autograd_profiler",
    "test_all_gather_object_subgroup", "test_scatter_object_list",
    "test_get_rank_size_full_group", "test_destroy_group", "test_get_backend", "test_Backend_enum_class",
    "test_get_future",
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_SyncBatchNorm_process_group", "test_grads_same_across_ranks_with_no_sync", "test_static_graph_api_cpu",
    "test_ddp_create_graph",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
    "test_barrier_timeout_full_group", "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_send_recv_any_source_autograd_profiler",
]

# What _DistTestBase does not exercise on CPU at world size 2, so that a pass
# here says nothing about it (docs/torch_suite.md lists these).
NOT_REACHED: list[str] = [
    "Bitwise reduce ops (BAND, BOR, BXOR): the suite uses them only in test_all_reduce_complex_unsupported_ops, "
    "where torch's Python layer rejects the complex tensor before any backend call.",
    "PREMUL_SUM: only torch's NCCL tests use it (gloo refuses it too); maestro implements it, and its own "
    "collective matrix covers it (the premul cases of tests/python/workers.py).",
    "Process-group splitting (Backend::supportsSplitting, split_group, new_group splitting its parent): torch "
    "splits only a group bound to an accelerator (device_id), which no test here makes; maestro implements "
    "Backend::split, which its own tests reach through ProcessGroup.split_group.",
    "A per-call timeout (BarrierOptions/AllreduceOptions timeout, dist.barrier(timeout=...)): its one test, "
    "test_barrier_timeout_arg, is skipped upstream on Linux; the group-wide timeout is exercised "
    "(test_barrier_timeout_global, test_barrier_timeout_full_group).",
    "Whatever needs more than 2 ranks (the *_group tests and the others skipped for the world size) or CUDA "
    "(the *_cuda tests, and every DDP test decorated skip_if_lt_x_gpu): see the skip reasons below.",
]
