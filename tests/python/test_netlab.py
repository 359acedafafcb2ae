"""Tests of scripts/netlab.py against real network namespaces (needs root)."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "netlab.py"
sys.path.insert(0, str(ROOT / "scripts"))
import netlab  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="netlab needs root (creates network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="netlab needs iproute2 (ip, tc)"),
]

MB = 1 << 20


def netns_with(prefix):
    try:
        return sorted(n for n in os.listdir(netlab.NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def delta(before, after):
    return [b - a for a, b in zip(before, after)]


def uniq(tag):
    """A lab name no concurrent test run uses (auto prefixes ml<N>- get reused)."""
    return f"{tag}{os.getpid()}"


@pytest.fixture(scope="module")
def pinned():
    with netlab.Lab(uniq("p"), core=200, access=1000, mode="pinned") as lab:
        yield lab
    assert netns_with(lab.prefix) == []


# --------------------------------------------------------------- lifecycle
def test_up_down_leaves_nothing_behind():
    lab = netlab.Lab(uniq("u"), hosts=4, leaves=2, spines=4)
    lab.up()
    try:
        names = [lab.ns(n) for n in lab.nodes()]
        assert len(names) == 10
        assert netns_with(lab.prefix) == sorted(names)
        assert os.path.exists(lab.state_path)
        assert lab.up_seconds < 5
    finally:
        lab.down()
    assert netns_with(lab.prefix) == []
    assert not os.path.exists(lab.state_path)
    lab.down()  # idempotent
    assert lab.down_seconds < 1


def test_exception_in_context_manager_cleans_up():
    with pytest.raises(RuntimeError, match="boom"):
        with netlab.Lab(uniq("e")) as lab:
            proc = lab.popen(0, ["sleep", "60"])
            raise RuntimeError("boom")
    assert netns_with(lab.prefix) == []
    assert proc.poll() is not None


def test_sigterm_cleans_up(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / 'scripts')!r})
        import netlab
        with netlab.Lab({uniq("s")!r}) as lab:
            lab.popen(0, ["sleep", "60"])
            print(lab.prefix, flush=True)
            time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        prefix = p.stdout.readline().strip()
        assert prefix and len(netns_with(prefix)) == 10
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
    assert netns_with(prefix) == []


def test_foreign_namespaces_are_never_touched():
    lab = netlab.Lab(uniq("f"))
    lab.up()
    foreign = lab.prefix + "foreign"  # merely looks like ours
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    created = [foreign]
    try:
        lab.down()
        assert netns_with(lab.prefix) == [foreign]
        # an existing namespace with a name the lab needs: refuse to build, leave it alone
        created.append(lab.prefix + "h0")
        subprocess.run(["ip", "netns", "add", created[-1]], check=True)
        clash = netlab.Lab(prefix=lab.prefix)
        with pytest.raises(netlab.NetlabError, match="already exist"):
            clash.up()
        clash.down()  # its reservation failed: must not touch anything
        assert netns_with(lab.prefix) == sorted(created)
        # automatic prefixes skip any prefix that has namespaces already
        n = 0
        while (os.path.exists(os.path.join(netlab.STATE_DIR, f"ml{n}-.json"))
               or netns_with(f"ml{n}-")):
            n += 1
        created.append(f"ml{n}-zz")
        subprocess.run(["ip", "netns", "add", created[-1]], check=True)
        with netlab.Lab() as other:
            assert other.prefix != f"ml{n}-"
        assert os.path.exists(os.path.join(netlab.NETNS_DIR, created[-1]))
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    assert netns_with(lab.prefix) == []


def test_cli_run_and_up_down():
    py = sys.executable
    r = subprocess.run([py, str(SCRIPT), "run", "--name", uniq("r"), "--hosts", "2", "--leaves", "2",
                        "--spines", "2",
                        "--", "sh", "-c",
                        f"{py} {SCRIPT} exec 0 -- ip -br addr show eth0 && "
                        f"{py} {SCRIPT} status | head -1 && echo $NETLAB_PREFIX && exit 3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    prefix = r.stdout.split()[-1]
    assert "10.1.0.2/24" in r.stdout and "10.1.0.11/24" in r.stdout
    assert netns_with(prefix) == []
    name = f"t{os.getpid()}"
    subprocess.run([py, str(SCRIPT), "up", "--name", name, "--core", "none", "--access", "none"],
                   check=True, capture_output=True, timeout=60)
    def cli(*args):
        return subprocess.run([py, str(SCRIPT), *args, "--name", name], capture_output=True,
                              text=True, check=True, timeout=30).stdout
    try:
        assert len(netns_with(f"ml-{name}-")) == 10
        assert "rate   none" in cli("status")
        cli("linkdown", "0", "1")
        cli("linkrate", "1", "2", "50")
        st = cli("status")
        assert "DOWN(blackhole)" in st and "rate     50" in st
        cli("linkup", "0", "1")
        assert "DOWN" not in cli("status")
        cli("bg", "--spine", "2", "--mbit", "20", "--detach")
        assert "background flows" in cli("status")
        cli("bgstop")
        assert "background flows" not in cli("status")
        cli("bg", "--spine", "3", "--mbit", "20", "--detach")  # left for down to kill
    finally:
        subprocess.run([py, str(SCRIPT), "down", "--name", name], check=True, capture_output=True)
    assert netns_with(f"ml-{name}-") == []
    subprocess.run([py, str(SCRIPT), "down", "--name", name], check=True, capture_output=True)


# ----------------------------------------------------------------- routing
def test_addresses(pinned):
    assert pinned.host_addr(2) == "10.1.2.2"
    assert pinned.aliases(0) == ["10.1.0.10", "10.1.0.11", "10.1.0.12", "10.1.0.13"]
    out = pinned.run(2, ["ip", "-br", "addr", "show", "eth0"], check=True).stdout
    for a in [pinned.host_addr(2)] + pinned.aliases(2):
        assert a + "/24" in out
    assert [pinned.leaf_of(i) for i in range(4)] == [0, 0, 1, 1]
    status = pinned.status()
    assert "L1-s3" in status and "10.1.3.13(s3)" in status


@pytest.mark.parametrize("src,dst", [(0, 2), (3, 1)])
def test_pinned_alias_k_crosses_spine_k(pinned, src, dst):
    for k in range(4):
        before = pinned.spine_bytes()
        r = pinned.transfer(src, dst, nbytes=2 * MB, src_addrs=pinned.alias_addr(src, k),
                            dst_addrs=pinned.alias_addr(dst, k))
        d = delta(before, pinned.spine_bytes())
        assert r.ok and r.bytes == 2 * MB
        assert d[k] >= 2 * MB, d
        assert sum(d) - d[k] < 0.02 * d[k], f"alias {k}: {d}"


def test_pinned_primary_address_is_hashed_to_some_spine(pinned):
    before = pinned.spine_bytes()
    assert pinned.transfer(0, 2, nbytes=MB).ok
    assert max(delta(before, pinned.spine_bytes())) >= MB


def test_link_down_blackholes_pinned_alias_and_up_restores(pinned):
    a = pinned.alias_addr
    pinned.link_down(0, 1)
    try:
        assert not pinned.reachable(0, a(2, 1), a(0, 1), timeout=0.5)
        assert not pinned.reachable(2, a(0, 1), a(2, 1), timeout=0.5)   # both directions
        assert pinned.reachable(0, a(2, 0), a(0, 0), timeout=2)
        assert pinned.reachable(0, a(2, 2), a(0, 2), timeout=2)
    finally:
        pinned.link_up(0, 1)
    assert pinned.reachable(0, a(2, 1), a(0, 1), timeout=3)
    before = pinned.spine_bytes()
    assert pinned.transfer(0, 2, nbytes=MB, src_addrs=a(0, 1), dst_addrs=a(2, 1)).ok
    assert delta(before, pinned.spine_bytes())[1] >= MB


def test_link_down_reroute_moves_pinned_alias(pinned):
    a = pinned.alias_addr
    pinned.link_down(1, 3, reroute=True)
    try:
        before = pinned.spine_bytes()
        r = pinned.transfer(0, 2, nbytes=MB, src_addrs=a(0, 3), dst_addrs=a(2, 3))
        d = delta(before, pinned.spine_bytes())
        assert r.ok and d[3] < 0.02 * MB and sum(d) >= MB, d
    finally:
        pinned.link_up(1, 3)
    before = pinned.spine_bytes()
    assert pinned.transfer(0, 2, nbytes=MB, src_addrs=a(0, 3), dst_addrs=a(2, 3)).ok
    assert delta(before, pinned.spine_bytes())[3] >= MB


def test_rate_change_takes_effect(pinned):
    a = pinned.alias_addr
    pinned.set_link_rate(0, 2, 20)
    try:
        slow = pinned.transfer(0, 2, nbytes=MB, src_addrs=a(0, 2), dst_addrs=a(2, 2))
        assert slow.ok and 0 < slow.mbit < 1.5 * 20, slow
        # the other spines keep their rate
        fast = pinned.transfer(0, 2, nbytes=4 * MB, src_addrs=a(0, 0), dst_addrs=a(2, 0))
        assert fast.mbit > 1.5 * 20, fast
    finally:
        pinned.set_link_rate(0, 2, 200)
    restored = pinned.transfer(0, 2, nbytes=4 * MB, src_addrs=a(0, 2), dst_addrs=a(2, 2))
    assert restored.mbit > 1.5 * 20, restored
    pinned.set_core_rate(30)
    try:
        r = pinned.transfer(0, 2, nbytes=MB, src_addrs=a(0, 1), dst_addrs=a(2, 1))
        assert 0 < r.mbit < 1.5 * 30, r
    finally:
        pinned.set_core_rate(200)
    pinned.set_access_rate(40)
    try:
        r = pinned.transfer(1, 3, nbytes=2 * MB)
        assert 0 < r.mbit < 1.5 * 40, r
    finally:
        pinned.set_access_rate(1000)


def test_background_raises_that_spines_counter(pinned):
    with pinned.background(spine=3, mbit=50) as bg:
        assert bg.alive()
        before, t0 = pinned.spine_bytes(), time.monotonic()
        time.sleep(0.5)
        d, dt = delta(before, pinned.spine_bytes()), time.monotonic() - t0
    assert d[3] > 1 * MB, d            # ~3 MB at 50 Mbit
    assert d[3] < dt * 1.5 * 50e6 / 8 + 256 * 1024, d  # paced
    assert sum(d) - d[3] < 0.02 * d[3], d
    assert pinned._state()["background"] == {}
    assert "pref 50" not in pinned.run("L0", ["ip", "rule"]).stdout


def test_ecmp_mode_connectivity_and_spreading():
    with netlab.Lab(mode="ecmp", hosts=4, leaves=2, spines=4) as lab:
        rules = lab.run("L0", ["ip", "rule"]).stdout
        assert "lookup 10" not in rules  # no pinning rules
        for src, dst in [(0, 2), (0, 3), (1, 2), (3, 0), (0, 1)]:
            assert lab.reachable(src, lab.host_addr(dst), timeout=2), (src, dst)
            assert lab.reachable(src, lab.aliases(dst)[1], lab.aliases(src)[2], timeout=2)
        before = lab.spine_bytes()
        r = lab.transfer(0, 2, nbytes=256 * 1024, streams=12)
        d = delta(before, lab.spine_bytes())
        assert r.ok and r.bytes == 12 * 256 * 1024
        assert sum(x > 200 * 1024 for x in d) >= 2, d  # 12 flows all on one spine: p = 4^-11
        # background pinning works without alias rules too
        with lab.background(spine=1, mbit=40, proto="udp"):
            before = lab.spine_bytes()
            time.sleep(0.4)
            d = delta(before, lab.spine_bytes())
        assert d[1] > 0.5 * MB and sum(d) - d[1] < 0.05 * d[1], d


# ------------------------------------------------------------------ labrun
def test_labrun_ends_the_run_soon_after_a_rank_fails(pinned):
    """A rank that fails must not leave the others waiting on it until the
    run's timeout (a benchmark waited 900 s on a rank 0 that never started)."""
    import labrun
    script = ("import os, sys, time\n"
              "if os.environ['RANK'] == '0': sys.exit(3)\n"
              "time.sleep(600)\n")
    t0 = time.monotonic()
    results = labrun.run(pinned, ["-c", script], world=2, timeout=300, fail_fast=1)
    took = time.monotonic() - t0
    assert [r.returncode for r in results][0] == 3
    assert results[1].returncode < 0 and "killed 1 s after rank 0 failed" in results[1].stderr
    assert took < 60, f"the run took {took:.0f} s; the rank left waiting was not ended"


def test_labrun_rendezvous_port_is_free_and_below_the_ephemeral_range(pinned):
    import labrun
    low = int(pinned.run(0, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()[0])
    # Listeners on two of the three ports just below the range: the third is the only free one.
    listener = pinned.popen(0, [sys.executable, "-c", textwrap.dedent(f"""
        import socket, time
        socks = []
        for port in ({low - 1}, {low - 3}):
            s = socket.socket(); s.bind(("0.0.0.0", port)); s.listen(); socks.append(s)
        print("up", flush=True); time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "up"
        assert {labrun.rendezvous_port(pinned, 0, span=3) for _ in range(10)} == {low - 2}
        assert low - 12000 <= labrun.rendezvous_port(pinned, 0) < low
    finally:
        listener.kill()
        listener.wait()
