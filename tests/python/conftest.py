import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

pytest_plugins = ["require_suites"]

# The modules of the full tier only (scripts/test.sh --full, what CI runs):
# the slow ones (a lab of network namespaces, a Soft-RoCE VM, training,
# torchrun examples, Lightning and Accelerate, the PyTorch suite, scale, soak,
# the benchmark smoke run).
# scripts/test.sh without --full runs the others (-m "not full"): the fast
# tier a contributor runs before each commit.
FULL_TIER = {
    "test_bench_smoke", "test_examples", "test_frameworks", "test_gloo_devices", "test_lab", "test_netlab", "test_rank_bench",
    "test_scale", "test_soak", "test_softroce", "test_torch_suite", "test_train", "test_vnic",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs root and builds network namespaces")
    config.addinivalue_line("markers", "full: runs in the full tier only (scripts/test.sh --full)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in FULL_TIER:
            item.add_marker(pytest.mark.full)
