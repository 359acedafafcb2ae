import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

pytest_plugins = ["require_suites"]


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs root and builds network namespaces")
