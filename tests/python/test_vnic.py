"""maestro-vnic against a real interface in a throwaway network namespace."""
import os
import shutil
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a network namespace")


@pytest.fixture
def netns():
    name = f"mvnic-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # A veth pair: this kernel has no dummy driver.
        for cmd in (["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                    ["ip", "addr", "add", "10.99.0.1/24", "dev", "d0"], ["ip", "link", "set", "d0", "up"]):
            subprocess.run(["ip", "netns", "exec", name, *cmd], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def vnic(ns, *args):
    tool = shutil.which("maestro-vnic", path=os.path.dirname(sys.executable))
    argv = [tool] if tool else [sys.executable, "-m", "maestro_torch.vnic"]
    return subprocess.run(["ip", "netns", "exec", ns, *argv, *args], capture_output=True, text=True)


def test_add_list_remove(netns):
    r = vnic(netns, "add", "d0", "--count", "3", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == [f"ip addr add 10.99.0.{i}/24 dev d0" for i in (2, 3, 4)]
    assert "10.99.0.2" not in vnic(netns, "list", "d0").stdout, "--dry-run changed nothing"
    r = vnic(netns, "add", "d0", "--count", "3")
    assert r.returncode == 0, r.stderr
    listing = vnic(netns, "list", "d0").stdout
    assert "export MAESTRO_VNICS=10.99.0.2,10.99.0.3,10.99.0.4" in listing
    assert "no RDMA device on this interface" in listing
    r = vnic(netns, "remove", "d0", "10.99.0.3")
    assert r.returncode == 0, r.stderr
    assert "export MAESTRO_VNICS=10.99.0.2,10.99.0.4" in vnic(netns, "list", "d0").stdout


@pytest.mark.parametrize("args, message", [
    (("add", "nope0", "10.99.0.5"), "no interface named 'nope0'"),
    (("add", "d0", "192.168.7.7"), "outside d0's subnets (10.99.0.0/24)"),
    (("add", "d0", "10.99.0.1"), "already an address of d0"),
    (("add", "d0", "ten.one"), "is not an IP address"),
    (("add", "d0"), "nothing to add"),
    (("remove", "d0", "10.99.0.9"), "not an address of d0"),
    (("remove", "d0", "10.99.0.1"), "primary address"),
])
def test_bad_input_is_refused_clearly(netns, args, message):
    r = vnic(netns, *args)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
