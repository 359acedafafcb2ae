"""`python -m maestro_torch.doctor`: each check on this host, and the routes
and core hops to a peer across a real leaf-spine lab."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import netlab  # noqa: E402


def doctor(*args, env=None, prefix=()):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAESTRO_")}
    clean.update(env or {})
    return subprocess.run([*prefix, sys.executable, "-m", "maestro_torch.doctor", *args], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


def findings(run):
    return [json.loads(line) for line in run.stdout.splitlines()]


def by_check(found, check):
    return [f for f in found if f["check"] == check]


def test_defaults_pass_and_say_that_hosts_get_one_path_without_vnics():
    run = doctor("--json")
    found = findings(run)
    assert run.returncode == 0, run.stdout + run.stderr
    assert {f["check"] for f in found} >= {"knobs", "vnics", "nofile", "memlock", "congestion", "verbs", "single-copy"}
    assert all(f["level"] in ("OK", "INFO", "WARN", "FAIL") for f in found)
    [vnics] = by_check(found, "vnics")
    assert vnics["level"] == "WARN" and "single path" in vnics["text"] and "MAESTRO_IFNAME" in vnics["fix"]
    [cc] = by_check(found, "congestion")
    assert cc["level"] in ("OK", "WARN") and "auto" in cc["text"]


def test_a_vnic_this_host_does_not_own_fails_and_is_named():
    run = doctor(env={"MAESTRO_VNICS": "127.0.0.1,192.0.2.7"})
    assert run.returncode == 1
    assert "FAIL  vnics" in run.stdout and "192.0.2.7" in run.stdout and "maestro-vnic add" in run.stdout


def test_a_master_addr_on_loopback_is_a_warning_and_a_reachable_one_is_ok():
    run = doctor("--json", env={"MASTER_ADDR": "localhost"})
    [master] = by_check(findings(run), "master-addr")
    assert master["level"] == "WARN" and "other hosts cannot reach it" in master["text"], master
    addr = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    if addr:
        run = doctor("--json", env={"MASTER_ADDR": addr[0]})
        [master] = by_check(findings(run), "master-addr")
        assert master["level"] == "OK", master


def test_a_knob_that_does_not_parse_fails_with_the_backends_own_message():
    run = doctor("--json", env={"MAESTRO_WINDOW": "many"})
    assert run.returncode == 1
    [knobs] = findings(run)
    assert knobs["level"] == "FAIL" and "MAESTRO_WINDOW" in knobs["text"]


def test_routes_from_each_vnic_and_no_router_on_loopback():
    run = doctor("--json", "--peer", "127.0.0.1", env={"MAESTRO_VNICS": "127.0.0.1,127.0.0.2,127.0.0.3"})
    assert run.returncode == 0, run.stdout + run.stderr
    found = findings(run)
    [vnics] = by_check(found, "vnics")
    assert vnics["level"] == "OK" and "3 vNICs" in vnics["text"]
    [routes] = by_check(found, "routes")
    assert routes["level"] == "OK" and "127.0.0.3" in routes["text"]
    [disc] = by_check(found, "discovery")
    assert disc["level"] == "INFO" and "no router answered" in disc["text"]


def test_a_low_descriptor_limit_is_a_warning_with_its_fix():
    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit (util-linux)")
    run = doctor("--json", env={"MAESTRO_VNICS": "127.0.0.1,127.0.0.2"}, prefix=("prlimit", "--nofile=300:300"))
    [nofile] = by_check(findings(run), "nofile")
    assert nofile["level"] == "WARN" and "about 59 peers at 2 paths" in nofile["text"] and "ulimit -n" in nofile["fix"]
    run = doctor("--json", env={"MAESTRO_VNICS": "127.0.0.1,127.0.0.2"}, prefix=("prlimit", "--nofile=8192:8192"))
    [nofile] = by_check(findings(run), "nofile")
    assert nofile["level"] == "OK"  # the positive control


@pytest.mark.full
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="the lab needs root and iproute2")
def test_on_an_ecmp_fabric_the_probes_find_several_core_hops():
    # 8 spines and 4 aliases per host: more core hops than vNICs, so the
    # doctor says how many paths MAESTRO_PATHS=auto opens, and sizes the
    # descriptor check by it.
    with netlab.Lab(f"doc{os.getpid()}", mode="ecmp", hosts=4, leaves=2, spines=8, aliases=4) as lab:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAESTRO_")}
        env["MAESTRO_IFNAME"] = "eth0"
        run = lab.run(0, [sys.executable, "-m", "maestro_torch.doctor", "--json", "--peer", lab.host_addr(2)],
                      env=env, cwd=str(ROOT), timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        found = findings(run)
        [vnics] = by_check(found, "vnics")
        assert vnics["level"] == "OK" and all(a in vnics["text"] for a in lab.aliases(0))
        [routes] = by_check(found, "routes")
        assert routes["level"] == "OK"
        [disc] = by_check(found, "discovery")
        assert disc["level"] == "OK", disc
        hops = disc["text"].split("(")[1].split(")")[0].split(", ")
        assert len(hops) > 4 and all(lab.spine_of_hop(h) in range(8) for h in hops), disc
        assert f"MAESTRO_PATHS=auto will open {len(hops)} paths per peer" in disc["text"], disc
        [nofile] = by_check(found, "nofile")
        assert f"at {len(hops)} paths each" in nofile["text"], nofile
        # A peer on the same leaf: no router two hops out.
        run = lab.run(0, [sys.executable, "-m", "maestro_torch.doctor", "--json", "--peer", lab.host_addr(1)],
                      env=env, cwd=str(ROOT), timeout=120)
        [disc] = by_check(findings(run), "discovery")
        assert disc["level"] == "INFO", disc
