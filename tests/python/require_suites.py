"""A pytest plugin: with MAESTRO_REQUIRE_ALL_SUITES=1 (CI sets it), a run in
which any test was skipped fails and names them. The lab, Soft-RoCE and
netlab suites skip without root; a CI run that skipped them tested less than
it claims, so it must not pass."""
import os

_skipped = []


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_collectreport(report):
    # A module that skips itself while it is collected (pytest.skip(...,
    # allow_module_level=True), an importorskip) never reaches a test report.
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("MAESTRO_REQUIRE_ALL_SUITES") != "1" or not _skipped:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reasons = sorted({reason for _, reason in _skipped})
    lines = [f"MAESTRO_REQUIRE_ALL_SUITES=1: {len(_skipped)} test(s) were skipped, so this run fails:"]
    lines += [f"  {reason}" for reason in reasons]
    lines += [f"  e.g. {_skipped[0][0]}"]
    if reporter is not None:
        reporter.write_line("")
        for line in lines:
            reporter.write_line(line, red=True)
    session.exitstatus = 1
