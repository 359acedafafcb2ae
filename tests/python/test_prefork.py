"""scripts/prefork.py: a rank forked from the server behaves as one started
with `python SCRIPT`: its argv, environment, working directory and exit code;
its interpreter's normal exit (atexit handlers run); the OpenMP thread count
from its own environment; torch already imported, maestro_torch not; and, as
root, the network namespace it was given."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from prefork import Prefork  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with Prefork() as pf:
        yield pf


def run(server, argv, **kw):
    p = server.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    code = p.wait(timeout=60)
    return code, p.stdout.read(), p.stderr.read()


def test_a_script_gets_its_argv_environment_directory_and_exit_code(server, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, sys
        import torch
        atexit.register(lambda: print("atexit ran", flush=True))
        print(__name__, sys.argv[1:], os.environ.get("FOO"), os.environ.get("HOME") is None, os.getcwd(),
              sys.path[0], torch.get_num_threads(), "maestro_torch" in sys.modules, flush=True)
        sys.exit(7)
    """))
    env = {"FOO": "bar", "OMP_NUM_THREADS": "1", "PATH": os.environ["PATH"]}
    code, out, err = run(server, [str(script), "a", "b"], env=env, cwd=str(tmp_path))
    assert code == 7, err
    first, atexit_line = out.splitlines()
    assert first == f"__main__ ['a', 'b'] bar True {tmp_path} {tmp_path} 1 False"
    assert atexit_line == "atexit ran"


def test_an_exception_is_printed_and_exits_1_and_a_kill_is_reported_as_a_signal(server):
    code, out, err = run(server, ["-c", "raise ValueError('boom')"])
    assert code == 1 and "ValueError: boom" in err
    p = server.popen(["-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert p.poll() is None
    p.kill()
    assert p.wait(timeout=30) == -9


def test_not_a_python_script_is_refused(server):
    with pytest.raises(ValueError, match="Python script"):
        server.popen(["ls"])


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_the_child_is_in_the_namespace_it_was_given(server):
    name = f"prefork{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        code, out, err = run(server, ["-c", "import os; print(os.stat('/proc/self/ns/net').st_ino)"], netns=name)
        assert code == 0, err
        assert int(out) == os.stat(f"/run/netns/{name}").st_ino != os.stat("/proc/self/ns/net").st_ino
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
