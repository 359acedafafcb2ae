"""The docs must match the code: README's knob table is the knob table, every
variable the docs name exists, every knob default they quote is the code's,
and so are the sizes, counts, path knobs and threads the README states."""
import os
import re

import maestro_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_knob_table_matches_the_code():
    readme = open(os.path.join(ROOT, "README.md")).read()
    rows = re.findall(r"^\| `(MAESTRO_\w+)` \| `(\w+)` \| `([^`]*)` \| (yes)? *\| (.*) \|$", readme, re.M)
    documented = {env: (name, default, bool(gw), doc) for env, name, default, gw, doc in rows}
    code = {k["env"]: (k["name"], k["default"] or "(unset)", k["group_wide"], k["doc"]) for k in maestro_torch.knobs()}
    assert documented == code, ("README's knob table differs from csrc/common/config.cc: "
                                "run .venv/bin/python scripts/update_readme_knobs.py")


def test_readme_commands_exist():
    readme = open(os.path.join(ROOT, "README.md")).read()
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert script in readme and os.access(os.path.join(ROOT, script), os.X_OK)
    assert "scripts/test.sh --full" in readme
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^exec bash scripts/test\.sh --full$", ci, re.M), "CI must run the full tier"


def _docs():
    import glob

    return {path: open(path).read() for path in [os.path.join(ROOT, "README.md")] +
            sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))}


# Variables the docs name that are not knobs of the backend: the test and
# build scripts' own. Each must still be read somewhere in the code.
NOT_KNOBS = ("MAESTRO_REQUIRE_ALL_SUITES", "MAESTRO_REQUIRE_GPU", "MAESTRO_SANITIZE", "MAESTRO_TEST_DEVICE")


def test_every_variable_the_docs_name_exists():
    knobs = {k["env"] for k in maestro_torch.knobs()}
    named = {m for text in _docs().values() for m in re.findall(r"MAESTRO_[A-Z0-9_]+", text)}
    stale = sorted(named - knobs - set(NOT_KNOBS))
    assert not stale, f"the docs name variables that are neither knobs nor listed in NOT_KNOBS: {stale}"
    code = open(os.path.join(ROOT, ".ci", "run")).read()
    for d in ("scripts", "tests", "maestro_torch"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, d)):
            # Not the harnesses' own caches (scripts/softroce/.cache holds a
            # whole virtualenv: reading it took 20 s of CPU).
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
            for f in files:
                if f.endswith((".py", ".sh")) and f != "test_docs.py":
                    code += open(os.path.join(dirpath, f), errors="replace").read()
    unread = [v for v in NOT_KNOBS if v not in code]
    assert not unread, f"NOT_KNOBS lists variables nothing reads any more: {unread}"


def test_defaults_the_docs_quote_are_the_knobs_defaults():
    # "`MAESTRO_X` (10 s by default ...", "`MAESTRO_X` (0.6)", and a table row
    # "| `MAESTRO_X` | 2 s |": the number must be the knob's default.
    defaults = {k["env"]: k["default"] for k in maestro_torch.knobs()}
    quoted = []
    for path, text in _docs().items():
        for env, value in re.findall(r"`(MAESTRO_[A-Z0-9_]+)`(?: \(| \| )(\d+(?:\.\d+)?)(?: s)?(?:\)| by default| \|)", text):
            quoted.append((os.path.relpath(path, ROOT), env, value))
    assert len(quoted) >= 8, quoted  # the timeouts table and the hunting paragraph at least
    wrong = [(p, env, value, defaults.get(env)) for p, env, value in quoted
             if env not in defaults or float(value) != float(defaults[env])]
    assert not wrong, f"(doc, knob, quoted default, the code's default): {wrong}"


def test_sizes_and_counts_the_readme_quotes_are_the_codes():
    # Claims derived from constants the code declares once; the README's
    # lines wrap, so the text is compared with its whitespace folded.
    c = maestro_torch._C._constants()
    readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())

    def kib(b):
        assert b % 1024 == 0, b
        return f"{b // 1024} KiB"

    small, direct = kib(c["small_reduce_bytes"]), kib(c["direct_reduce_bytes"])
    claims = [f"chunks ({kib(c['verbs_chunk_bytes'])} on RDMA as in the paper, {kib(c['tcp_chunk_bytes'])} on TCP;",
              f"one chunk per path, down to {kib(c['tcp_min_chunk_bytes'])}, and all-to-all's go to another host in "
              f"{kib(c['tcp_min_chunk_bytes'])} chunks)",
              f"in the smallest chunks (`MAESTRO_MIN_CHUNK_SIZE`, {kib(c['tcp_min_chunk_bytes'])} on TCP)",
              f"({c['groups_sharing_paths']} groups at a time besides the default one)",
              f"up to {direct} every rank writes its tensor straight to the root",
              f"writes straight into the root's scratch, up to {direct};", f"up to {small} by a binomial tree",
              f"and reduce above {small})", f"a reduce of up to {small}",
              f"instead of n-1 at once; up to {small} |"]
    across, one = kib(c["recursive_doubling_bytes_across_hosts"]), kib(c["recursive_doubling_bytes_one_host"])
    claims += [f"each receiver lends each sender {c['eager_slots']} slots of that size",
               f"any while the {c['eager_slots']} slots are taken go by the round trip"]
    claims += [f"small tensors by recursive doubling (up to {across} across hosts, {one} on one host:",
               f"up to {across} across hosts and {one} on one host |"]
    missing = [x for x in claims if x not in readme]
    assert not missing, f"README no longer says (or says otherwise than the code): {missing}"


def _folded_readme():
    return " ".join(open(os.path.join(ROOT, "README.md")).read().split())


def test_the_path_knobs_the_readme_lists_are_the_codes():
    listed = re.search(r"The path knobs are ((?:`\w+`, )+`\w+`,? and `\w+`) \(`csrc/multipath/shared_paths\.cc`\)",
                       _folded_readme())
    assert listed, "README no longer lists the path knobs a subgroup must share"
    readme = re.findall(r"`(\w+)`", listed.group(1))
    code = list(maestro_torch._C._constants()["path_knobs"])
    assert sorted(readme) == sorted(code), f"README lists {readme}, the code shares on {code}"
    assert set(code) <= {k["name"] for k in maestro_torch.knobs()}, code


def test_the_threads_the_readme_counts_are_the_ones_a_rank_runs():
    import scenarios
    from launcher import run_ranks

    readme = _folded_readme()
    claim = re.search(r"A rank of a 2-rank job on TCP, on the default group alone, runs (\d+) threads with the main "
                      r"one \((\d+) with gloo", readme)
    assert claim, "README no longer counts a rank's threads"
    env = {"MAESTRO_VNICS": "127.0.0.1,127.0.0.2", "MAESTRO_TRANSPORT": "tcp", "OMP_NUM_THREADS": "1"}
    seen = {}
    for backend in ("maestro", "gloo"):
        results = run_ranks(2, scenarios.threads_on_the_default_group, backend, env=env, timeout=120)
        assert all(status == "ok" for status, _ in results), results
        seen[backend] = [value for _, value in results]
    for rank, value in enumerate(seen["maestro"]):
        assert len(value["allreduce"]) == int(claim.group(1)), (rank, value["allreduce"])
        # The README names each of them, and the point-to-point one comes with the first message.
        named = {"maestro-io", "maestro-work", "maestro-monitor", "maestro-reconn"}
        assert named <= set(value["allreduce"]) and "maestro-p2p" not in value["allreduce"], value
        assert sorted(value["p2p"]) == sorted(value["allreduce"] + ["maestro-p2p"]), value
        for name in named | {"maestro-p2p"}:
            assert f"(`{name}`)" in readme, name
    for rank, value in enumerate(seen["gloo"]):
        assert len(value["allreduce"]) == int(claim.group(2)), (rank, value["allreduce"])
