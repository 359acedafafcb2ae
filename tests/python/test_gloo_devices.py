"""benchmarks/gloo_devices.py: the gloo peer with one device per address
(the suite's gloo-4dev), on 2 ranks of this host over loopback aliases."""
import os
import sys

import pytest

from launcher import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def test_one_gloo_device_per_address_reduces_exactly_and_uses_every_address():
    import workers

    res = run_ranks(2, workers.gloo_devices_allreduce, 2, timeout=120)
    assert all(s == "ok" for s, _ in res), res
    ranks = [r for _, r in res]
    for r in ranks:
        assert r["devices"] == 2, r
        assert set(r["addrs"]) <= set(r["listening"]), r  # each device listens on its own address
    # One rank of the pair connects to the other's devices, one connection
    # each: the accepting rank has a connection on each of its addresses.
    assert any(set(r["addrs"]) <= set(r["connected"]) for r in ranks), ranks


def test_options_carry_one_device_per_address_and_two_threads_each():
    import gloo_devices

    opts = gloo_devices.options("127.0.0.1, 127.0.0.2,127.0.0.3")
    assert len(opts._devices) == 3 and opts._threads == 6


def test_vnics_come_from_maestro_vnics(monkeypatch):
    import gloo_devices

    monkeypatch.setenv("MAESTRO_VNICS", "10.1.0.10,10.1.0.11")
    assert gloo_devices.parse("vnics") == ["10.1.0.10", "10.1.0.11"]
    monkeypatch.delenv("MAESTRO_VNICS")
    with pytest.raises(ValueError, match="MAESTRO_VNICS"):
        gloo_devices.parse("vnics")
    with pytest.raises(ValueError, match="no address"):
        gloo_devices.parse(" , ")


def test_variant_names_sort_gloo_from_maestro():
    import variants

    assert variants.gloo_device_count("gloo-4dev") == 4
    assert variants.gloo_device_count("gloo") is None
    assert variants.gloo_device_count("adaptive") is None
    assert variants.gloo_device_count("gloo-xdev") is None
    assert [v for v in ("gloo", "gloo-4dev", "adaptive", "single", "adaptive+cubic") if variants.is_gloo(v)] \
        == ["gloo", "gloo-4dev"]
    assert variants.maestro_policy("adaptive+cubic") == ("adaptive", "cubic")
    assert variants.maestro_policy("single") == ("single", "")
    # A twin (#name): a second group of the same configuration
    assert variants.maestro_policy("round_robin#2") == ("round_robin", "")
    assert variants.maestro_knobs("adaptive@min_chunk_size=256K#b") == {"min_chunk_size": "256K"}
    assert variants.is_gloo("gloo#2") and variants.gloo_device_count("gloo-4dev#2") == 4
    assert variants.is_maestro("adaptive+cubic#2")
