"""Stand-in for the `expecttest` package, which torch.testing._internal
imports but which torch does not declare as a dependency. dist_suite.py puts
this folder on sys.path only when the real package is missing (an older
.venv; requirements/dev.txt installs it). No test of distributed_test.py
uses expect-tests: the one method they would need refuses to run."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, *args, **kwargs):  # noqa: N802 - expecttest's name
        raise NotImplementedError("the real expecttest package is not installed (pip install expecttest)")
