"""The verbs transport on real rdma-core, over Soft-RoCE in a QEMU VM
(scripts/softroce/run.sh). Needs root (the harness installs QEMU, a kernel
and rdma-core, and the VM loads rdma_rxe); without it these tests skip and
say why -- they are never counted as passed without running."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "scripts", "softroce", "run.sh")
BUILD = os.path.join(ROOT, "build", "verbs")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the Soft-RoCE harness needs root (QEMU, rdma_rxe)")


@pytest.fixture(scope="module")
def verbs_tests_binary():
    """The C++ verbs tests, built on the host (the VM runs host binaries)."""
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DMAESTRO_WITH_VERBS=ON", "-DMAESTRO_BUILD_TESTS=ON"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", BUILD, "--target", "maestro_verbs_tests", "-j", str(os.cpu_count() or 2)],
                   check=True, capture_output=True)
    return os.path.join(BUILD, "maestro_verbs_tests")


def harness(*args, command_timeout=420):
    """run.sh with `--timeout command_timeout` (its own default, 420 s). The
    wait here is above the harness's own bound (that plus its boot
    allowance, SOFTROCE_BOOT_ALLOWANCE, 600 s unless set), so the harness,
    not this, reports a run too slow."""
    boot_allowance = int(os.environ.get("SOFTROCE_BOOT_ALLOWANCE", "600"))
    p = subprocess.run([HARNESS, "--timeout", str(command_timeout), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=command_timeout + boot_allowance + 100)
    print(p.stdout[-6000:], p.stderr[-3000:], sep="\n")
    return p


def gtest_summary(output):
    passed = re.search(r"\[  PASSED  \] (\d+) tests?", output)
    skipped = re.search(r"\[  SKIPPED \] (\d+) tests?", output)
    failed = re.search(r"\[  FAILED  \] (\d+) tests?", output)
    return (int(passed.group(1)) if passed else 0, int(skipped.group(1)) if skipped else 0,
            int(failed.group(1)) if failed else 0)


def verbs_tests_in_the_sources():
    """Every test the one-VM run must pass, read from the sources (not from
    the binary, whose contract tests exist only where an RDMA device is):
    the verbs tests but the two-VM one, and the transport contract."""
    names = set()
    for name in os.listdir(os.path.join(ROOT, "tests", "cpp", "verbs")):
        text = open(os.path.join(ROOT, "tests", "cpp", "verbs", name)).read()
        for suite, test in re.findall(r"^TEST(?:_F)?\((\w+), *(\w+)\)", text, re.M):
            if suite != "VerbsTwoVms" and not suite.startswith("DISABLED_"):
                names.add(f"{suite}.{test}")
    contract = open(os.path.join(ROOT, "tests", "cpp", "transport_contract.h")).read()
    names |= {f"TransportContract.{t}" for t in re.findall(r"^TEST_P\(TransportContract, *(\w+)\)", contract, re.M)}
    return names


def gtest_passed_names(output):
    """The names of the tests gtest says passed ("[       OK ] Suite.Name"),
    a value-parameterized one without its instantiation and parameter."""
    ran = re.findall(r"\[       OK \] (\S+) \(", output)
    return {re.sub(r"^\w+/(\w+\.\w+)/\w+$", r"\1", name) for name in ran}


@pytest.fixture(scope="module")
def one_vm(verbs_tests_binary):
    """One VM boot for both one-VM runs (a boot is 18-44 s of emulated CPU on
    an idle host, and took 508 s once beside CI's sanitizer builds): torch
    over verbs first, then the C++ verbs tests; each test judges its own part
    of the output. The torch run goes first so that in CI (scripts/test.sh
    --full, where this file's group starts beside the C++ stages) its import
    of torch, the longest part, runs beside the C++ stages rather than beside
    the Python suites, which keep both cores busier.
    Liveness bounds, not speed: the torch run takes 3-4 minutes on an idle
    2-core host, nearly all of it importing torch (210 s: its Python and its
    3 GB of libraries under an emulated CPU), and that import took 523 s
    with both cores kept busy (scripts/flaky.sh --contention) and, at an even
    share of the CPU, 1133 s beside CI's Python stage (the harness now gives
    QEMU a larger share); the ranks' own work took 22 s. The C++ tests take
    about 10 s in the VM: 420 s more is their bound. The harness bounds the
    boot apart (600 s: it took 508 s in one such run)."""
    import maestro_torch

    if not maestro_torch._C.has_verbs:
        pytest.fail("maestro_torch was built without the verbs transport although this test runs as root: "
                    "install libibverbs-dev and librdmacm-dev and rebuild (scripts/test.sh --full does)")
    script = ('"$1" tests/softroce/torch_over_verbs.py; t=$?; echo "torch over verbs: exit $t"; '
              '"$2" --gtest_filter=-VerbsTwoVms.*; g=$?; echo "verbs tests: exit $g"; [ $t = 0 ] && [ $g = 0 ]')
    p = harness("--", "sh", "-c", script, "one_vm", sys.executable, verbs_tests_binary, command_timeout=1200 + 420)
    torch_part, _, gtest_part = p.stdout.partition("torch over verbs: exit ")
    return p, torch_part, gtest_part


# First in this file: see one_vm.
def test_torch_over_verbs_in_the_vm(one_vm):
    p, torch_part, _ = one_vm
    assert "torch over verbs: PASS" in torch_part and "torch over verbs: exit 0" in p.stdout, \
        "the torch run in the VM failed (its output is above)"


def test_verbs_transport_in_one_vm(one_vm):
    p, _, gtest_part = one_vm
    assert "verbs tests: exit 0" in gtest_part, "verbs tests failed in the VM"
    passed, skipped, failed = gtest_summary(gtest_part)
    assert failed == 0 and skipped == 0, f"{failed} failed, {skipped} skipped"
    want = verbs_tests_in_the_sources()
    got = gtest_passed_names(gtest_part)
    assert len(want) >= 26 and got == want, (f"missing: {sorted(want - got)}; not in the sources: {sorted(got - want)}")


def test_verbs_between_two_vms(verbs_tests_binary):
    p = harness("--two-vms", "--", verbs_tests_binary, "--gtest_filter=VerbsTwoVms.*")
    assert p.returncode == 0, "the two-VM run failed"
    assert p.stdout.count("[  PASSED  ] 1 test") == 2, "both VMs must run the two-VM test"
