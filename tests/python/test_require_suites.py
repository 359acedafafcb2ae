"""CI must not pass a run that skipped a suite (require_suites.py)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(tmp_path, require, module_level=False):
    if module_level:
        (tmp_path / "test_one.py").write_text(
            "import pytest\n"
            "pytest.skip('no RDMA device (pretend)', allow_module_level=True)\n"
            "def test_never_collected():\n    pass\n")
    else:
        (tmp_path / "test_one.py").write_text(
            "import pytest\n"
            "def test_runs():\n    pass\n"
            "@pytest.mark.skipif(True, reason='needs root (pretend)')\n"
            "def test_needs_root():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=HERE)
    env.pop("MAESTRO_REQUIRE_ALL_SUITES", None)
    if require:
        env["MAESTRO_REQUIRE_ALL_SUITES"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "require_suites", "-p", "no:cacheprovider",
                           str(tmp_path / "test_one.py")], env=env, cwd=tmp_path, capture_output=True, text=True)


def test_a_skipped_suite_fails_a_run_that_requires_every_suite(tmp_path):
    r = _run(tmp_path, require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 test(s) were skipped" in r.stdout and "needs root (pretend)" in r.stdout, r.stdout


def test_a_module_that_skips_itself_at_collection_fails_it_too(tmp_path):
    r = _run(tmp_path, require=True, module_level=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no RDMA device (pretend)" in r.stdout, r.stdout
    assert _run(tmp_path, require=False, module_level=True).returncode in (0, 5)  # outside CI: a skip


def test_skips_are_allowed_outside_ci(tmp_path):
    r = _run(tmp_path, require=False)
    assert r.returncode == 0, r.stdout + r.stderr
