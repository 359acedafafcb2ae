"""PyTorch's own distributed test suite (DistributedTest._DistTestBase from
torch.testing._internal.distributed.distributed_test) on one backend, the way
torch's test/distributed/test_distributed_spawn.py runs it: a TestCase that
combines TestDistBackend with _DistTestBase, the ranks as processes, the
environment read from BACKEND, WORLD_SIZE, INIT_METHOD and TEMP_DIR.

One process runs one backend (distributed_test reads BACKEND when it is
imported, and its skip decorators are evaluated then): run.py starts this
module once for gloo and once for maestro and compares them. It writes one
JSON record per test (outcome, skip reason, first error line, seconds).

maestro is a plugin backend, unknown to distributed_test. Before that module
is imported, maestro joins the feature sets for what it implements
(selection.FEATURES), as third-party backends such as torch-ucc do, so that
the tests gloo runs on CPU run on maestro too; the sets that list what a
backend lacks (skip_collective) stay as they are. The tests gated on a
backend's name rather than a feature are lifted as selection.LIFT says, the
harness's own skips are selection.SKIP; both apply to gloo and maestro alike.

    BACKEND=maestro python tests/torch_suite/dist_suite.py --out maestro.json [--tests a,b] [--start fork]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

os.environ.setdefault("WORLD_SIZE", "2")
BACKEND = os.environ.setdefault("BACKEND", "gloo")
# The suite's own default is env://; file:// is what its barrier-timeout
# tests need and keeps every rendezvous on this host.
os.environ.setdefault("INIT_METHOD", "file:///tmp/maestro_torch_suite_init")

import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

from selection import FEATURES, LIFT, SKIP  # noqa: E402

META: dict = {}
if BACKEND == "maestro":
    import hashlib

    import maestro_torch  # noqa: F401,E402 - registers the backend

    # What this process loaded: its forked ranks run exactly this, whatever
    # happens to the file later (an editable install may point at a
    # checkout someone rebuilds).
    with open(maestro_torch._C.__file__, "rb") as _f:
        META["extension"] = {"path": maestro_torch._C.__file__, "sha256": hashlib.sha256(_f.read()).hexdigest()[:12],
                             "mtime": os.path.getmtime(maestro_torch._C.__file__)}

    for feature in FEATURES:
        DistTestCases.backend_feature[feature].add("maestro")

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

from errors import classify  # noqa: E402

# The profiler checks in the test bodies run only for the backends listed
# here. maestro's Work carries "maestro:<collective>" profiling titles as
# gloo's carries "gloo:<collective>", so it is held to the same checks.
if BACKEND == "maestro":
    for _allow in (distributed_test.PROFILING_SUPPORTED_BACKENDS,
                   distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
        _allow.append("maestro")

START_METHOD = os.environ.get("TORCH_SUITE_START", "fork")


class TestDistBackendOnCPU(TestDistBackend, DistributedTest._DistTestBase):
    """test_distributed_spawn's TestDistBackendWithSpawn; the ranks are forked
    by default (TORCH_SUITE_START=spawn spawns them, as upstream does): the
    parent never starts a process group, and a fork saves each rank
    re-importing torch, which on two cores is most of a short test."""

    def setUp(self):
        super().setUp()
        if START_METHOD == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def _skipped(name: str, reason: str):
    def test(self):
        raise unittest.SkipTest(reason)

    test.__name__ = name
    test.__unittest_skip__ = True
    test.__unittest_skip_why__ = reason
    return test


def _lifted(fn, body_backend: str | None):
    """fn without its skip marks (they sit on fn itself); with body_backend,
    the test's body (not the process group's creation, which is done by
    then) sees distributed_test.BACKEND == body_backend."""

    def test(self):
        if body_backend is None:
            return fn(self)
        real = distributed_test.BACKEND
        distributed_test.BACKEND = body_backend
        try:
            return fn(self)
        finally:
            distributed_test.BACKEND = real

    test.__name__ = fn.__name__
    test.__qualname__ = fn.__qualname__
    test.__doc__ = fn.__doc__
    return test


LIFTED: dict[str, str] = {}  # test -> the gate lifted on this backend
for _name, (_gate, _why, _body_backend) in LIFT.items():
    _fn = getattr(TestDistBackendOnCPU, _name, None)
    _gate = _gate.format(backend=BACKEND)
    if _fn is None or not getattr(_fn, "__unittest_skip__", False):
        continue  # not gated on this backend: runs as it is
    if not str(getattr(_fn, "__unittest_skip_why__", "")).startswith(_gate):
        continue  # skipped for another reason: that skip stays
    setattr(TestDistBackendOnCPU, _name, _lifted(_fn, _body_backend))
    LIFTED[_name] = _fn.__unittest_skip_why__

for _name, _reason in SKIP.items():
    if hasattr(TestDistBackendOnCPU, _name):
        setattr(TestDistBackendOnCPU, _name, _skipped(_name, f"skip list: {_reason}"))


def all_tests() -> list[str]:
    return sorted(unittest.TestLoader().getTestCaseNames(TestDistBackendOnCPU))


class _Recorder(unittest.TestResult):
    def __init__(self, out):
        super().__init__()
        self.out = out
        self.t0 = 0.0

    def startTest(self, test):
        super().startTest(test)
        self.t0 = time.monotonic()

    def _record(self, test, outcome, detail=""):
        rec = {"test": test._testMethodName, "outcome": outcome, "seconds": round(time.monotonic() - self.t0, 2)}
        if test._testMethodName in LIFTED:
            rec["lifted"] = LIFTED[test._testMethodName]
        if outcome == "skipped":
            rec["reason"] = detail
        elif detail:
            rec["error"] = detail
        print(f"[{BACKEND}] {rec['test']}: {outcome} ({rec['seconds']} s)" + (f": {detail[:200]}" if detail else ""),
              flush=True, file=sys.stderr)
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def _add_exc(self, test, err):
        text = "".join(traceback.format_exception(*err))
        outcome, line = classify(text)
        self._record(test, outcome, line)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._add_exc(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._add_exc(test, err)

    def addExpectedFailure(self, test, err):
        # Upstream marks it expected to fail: it failed, as expected -- not a pass.
        super().addExpectedFailure(test, err)
        self._record(test, "xfailed", classify("".join(traceback.format_exception(*err)))[1])

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON lines, one record per test")
    ap.add_argument("--tests", default="", help="comma-separated test names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the test names and exit")
    args = ap.parse_args(argv)
    names = all_tests()
    if args.list:
        print("\n".join(names))
        return 0
    if args.tests:
        wanted = [t for t in args.tests.split(",") if t]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"unknown tests: {', '.join(unknown)}", file=sys.stderr)
            return 2
        names = wanted
    suite = unittest.TestSuite(TestDistBackendOnCPU(n) for n in names)
    with open(args.out, "a") as out:
        if META:
            out.write(json.dumps({"meta": META}) + "\n")
        suite.run(_Recorder(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
