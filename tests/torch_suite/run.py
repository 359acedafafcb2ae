"""PyTorch's own distributed tests (DistributedTest._DistTestBase) on gloo and
on maestro, the same selection on both, side by side.

Each backend runs in its own process (tests/torch_suite/dist_suite.py: CPU,
world size 2, the ranks forked per test as torch's test_distributed_spawn.py
spawns them); this script compares the two: passed / failed / errored /
skipped per backend, and every test gloo passes but maestro does not, with
the first line of its error and, for known gaps, the cause
(tests/torch_suite/selection.py).

    python tests/torch_suite/run.py --write        # everything; records
        docs/results/data/torch_suite/torch_suite.json and docs/torch_suite.md
    python tests/torch_suite/run.py --subset ci    # what CI runs (tests/python/test_torch_suite.py)
    python tests/torch_suite/run.py --tests test_all_reduce_sum,test_barrier -v
    python tests/torch_suite/run.py --render       # the doc again from the recorded JSON

Exit status: 0 when no test gloo passes fails on maestro other than the known
gaps (and no known gap passes: then it is no longer one), 1 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import selection  # noqa: E402

BACKENDS = ("gloo", "maestro")
OUTCOMES = ("passed", "failed", "errored", "skipped", "xfailed")  # xfailed: upstream's expected failures
DATA = os.path.join(ROOT, "docs", "results", "data", "torch_suite", "torch_suite.json")
DOC = os.path.join(ROOT, "docs", "torch_suite.md")
LOGS = os.path.join(ROOT, "build", "torch_suite")


def tidy(text: str) -> str:
    """Upstream skip reasons cite bug reports by address; the record keeps
    the reason, not the address. Sets printed in a reason are sorted (their
    order changes from one process to the next)."""
    text = re.sub(r"https?://\S+", "(an upstream report)", text or "").strip()
    return re.sub(r"\{('[^{}]*')\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", text)


def list_tests(env: dict) -> list[str]:
    out = subprocess.run([sys.executable, os.path.join(HERE, "dist_suite.py"), "--out", os.devnull, "--list"],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"listing the tests failed:\n{out.stderr[-4000:]}")
    return out.stdout.split()


def run_backend(backend: str, tests: list[str], *, timeout: int, start: str, log_dir: str,
                verbose: bool) -> tuple[dict, float, list]:
    """{test: record} for one backend, the wall time, and what each suite
    process said about itself (maestro's: the extension it loaded). A suite process
    that dies (it should not: the ranks are its children) loses only the
    test it was in, recorded as errored; it restarts after that test."""
    t0 = time.monotonic()
    records: dict[str, dict] = {}
    metas: list[dict] = []
    log_path = os.path.join(log_dir, f"{backend}.log")
    with tempfile.TemporaryDirectory(prefix=f"torch_suite_{backend}_") as tmp, open(log_path, "w") as log:
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE="2", TEMP_DIR=tmp,
                   INIT_METHOD=f"file://{os.path.join(tmp, 'init')}", MASTER_ADDR="127.0.0.1",
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout), TORCH_SUITE_START=start,
                   PYTHONUNBUFFERED="1")
        out = os.path.join(tmp, "records.jsonl")
        pending = list(tests)
        while pending:
            cmd = [sys.executable, os.path.join(HERE, "dist_suite.py"), "--out", out, "--tests", ",".join(pending)]
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if verbose and line.startswith(f"[{backend}] "):
                    sys.stderr.write(line)
            rc = proc.wait()
            if os.path.exists(out):
                with open(out) as f:
                    for line in f:
                        rec = json.loads(line)
                        if "meta" in rec:
                            metas.append(rec["meta"])
                        else:
                            records[rec.pop("test")] = rec
            pending = [t for t in tests if t not in records]
            if pending:
                records[pending[0]] = {"outcome": "errored", "seconds": 0.0,
                                       "error": f"the suite process exited ({rc}) during this test"}
                pending = pending[1:]
    for rec in records.values():
        for key in ("reason", "error", "lifted"):
            if key in rec:
                rec[key] = tidy(rec[key])
    return records, time.monotonic() - t0, metas


def counts(records: dict) -> dict:
    c = collections.Counter(r["outcome"] for r in records.values())
    out = {k: c.get(k, 0) for k in OUTCOMES}
    out["skipped_by_skip_list"] = sum(1 for r in records.values()
                                      if r["outcome"] == "skipped" and r.get("reason", "").startswith("skip list:"))
    return out


def compare(results: dict) -> tuple[list, list, list]:
    """(regressions: gloo passed, maestro failed, errored, skipped (a test
    the suite skips for maestro tests nothing of it: only a known gap may) or
    failed as upstream expects it to;
    known gaps that passed; tests maestro passes that gloo does not)."""
    regressions, fixed, maestro_only = [], [], []
    for test in sorted(results["gloo"]):
        g, m = results["gloo"][test], results["maestro"].get(test)
        if m is None:
            continue
        known = selection.KNOWN_GAPS.get(test)
        if g["outcome"] == "passed" and m["outcome"] in ("failed", "errored", "skipped", "xfailed"):
            entry = {"test": test, "outcome": m["outcome"], "error": m.get("error") or m.get("reason", "")}
            if known:
                entry.update(category=known[0], call=known[1], cause=known[2])
            regressions.append(entry)
        elif known and m["outcome"] == "passed":
            fixed.append(test)
        if m["outcome"] == "passed" and g["outcome"] != "passed":
            maestro_only.append({"test": test, "gloo": g["outcome"], "gloo_detail": g.get("error") or g.get("reason", "")})
    return regressions, fixed, maestro_only


def machine() -> dict:
    import torch

    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"cpu": cpu, "cores": os.cpu_count(),
            "memory_GiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
            "maestro_commit": git("rev-parse", "--short", "HEAD") or "?",
            "worktree_clean": git("status", "--porcelain", "--untracked-files=no") == ""}


def extension(loaded: list[dict]) -> dict:
    """Which maestro was tested: the extension the maestro suite process
    loaded (its ranks are forked from it) -- an editable install may load it
    from another checkout -- its hash, and the commit and state of that
    checkout."""
    exts = [m["extension"] for m in loaded if "extension" in m]
    if not exts:
        return {}
    path = exts[0]["path"]
    src = os.path.dirname(os.path.dirname(path))
    git = lambda *a: subprocess.run(["git", "-C", src, *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"sha256": exts[0]["sha256"],
            "built": datetime.datetime.fromtimestamp(exts[0]["mtime"]).astimezone().isoformat(timespec="seconds"),
            "checkout": "this one" if os.path.realpath(src) == os.path.realpath(ROOT) else src,
            "checkout_commit": git("rev-parse", "--short", "HEAD") or "?",
            "checkout_clean": git("status", "--porcelain", "--untracked-files=no", "--", "csrc", "CMakeLists.txt",
                                  "setup.py") == "",
            "changed_during_run": len({e["sha256"] for e in exts}) > 1}


def render(rec: dict) -> str:
    """docs/torch_suite.md from the record."""
    d, m = rec["data"], rec["machine"]
    x = d.get("extension", {})
    per = d["backends"]
    lines = [
        "# PyTorch's distributed test suite on maestro",
        "",
        "<!-- Generated by tests/torch_suite/run.py --write from docs/results/data/torch_suite/torch_suite.json;"
        " do not edit. -->",
        "",
        "PyTorch's own `DistributedTest._DistTestBase` (`torch.testing._internal.distributed.distributed_test`,"
        " the suite torch runs on its backends through `test/distributed/test_distributed_spawn.py`) run on gloo and"
        " on maestro as a plugin backend: CPU, world size 2, the ranks as processes "
        f"({d['start_method']}ed per test), the same selection on both. A test is counted as passed only when it ran"
        " and passed; every skip is counted as skipped.",
        "",
        f"*Recorded {rec['date']} with `{rec['command']}` at commit {m['maestro_commit']}"
        f"{'' if m['worktree_clean'] else ' (with uncommitted changes)'}, torch {m['torch']}, {m['cores']} cores"
        f" ({m['cpu']}), Linux {m['kernel']}; {rec['seconds']:.0f} s in all. Per-test limit {d['per_test_timeout_s']} s.*",
        "",
        f"*maestro under test: the extension {x.get('sha256', '?')} built {x.get('built', '?')} in "
        f"{'this checkout' if x.get('checkout') == 'this one' else 'the checkout ' + str(x.get('checkout'))}"
        f" (at {x.get('checkout_commit', '?')}{'' if x.get('checkout_clean') else ', with uncommitted C++ changes'}"
        " after the run)"
        f"{'; it was rebuilt during the run, so not every test ran on it' if x.get('changed_during_run') else ''}.*",
        "",
        "| | gloo | maestro |",
        "|---|---|---|",
    ]
    for k in OUTCOMES:
        if k in per["gloo"]["counts"]:  # records made before xfailed was counted apart lack it
            lines.append(f"| {k} | {per['gloo']['counts'][k]} | {per['maestro']['counts'][k]} |")
    lines += [f"| of the skipped: by the harness's skip list | {per['gloo']['counts']['skipped_by_skip_list']} | "
              f"{per['maestro']['counts']['skipped_by_skip_list']} |",
              f"| tests selected | {d['selected']} | {d['selected']} |",
              f"| wall time | {per['gloo']['wall_s']:.0f} s | {per['maestro']['wall_s']:.0f} s |", ""]

    regs = d["regressions"]
    lines += ["## Tests gloo passes and maestro does not", ""]
    if not regs:
        lines += ["None.", ""]
    else:
        by_cat = collections.OrderedDict()
        for r in regs:
            by_cat.setdefault(r.get("category", "not yet explained"), []).append(r)
        lines += [f"{len(regs)} test{'s' * (len(regs) != 1)} in {len(by_cat)} "
                  f"categor{'ies' if len(by_cat) != 1 else 'y'}.", ""]
        for cat, rs in by_cat.items():
            lines += [f"### {cat}", ""]
            if "cause" in rs[0]:
                lines += [f"c10d call: `{rs[0]['call']}`. Cause: {rs[0]['cause']}", ""]
            lines += ["| test | outcome | first error line |", "|---|---|---|"]
            for r in rs:
                err = r["error"].replace("|", "\\|")
                lines.append(f"| `{r['test']}` | {r['outcome']} | `{err}` |")
            lines.append("")
    if d["known_gaps_passing"]:
        lines += ["Known gaps that now pass (remove them from `KNOWN_GAPS`): "
                  + ", ".join(f"`{t}`" for t in d["known_gaps_passing"]), ""]

    lines += ["## Tests maestro passes and gloo does not", ""]
    if not d["maestro_only"]:
        lines += ["None.", ""]
    else:
        lines += ["| test | gloo | gloo's error or skip reason |", "|---|---|---|"]
        for r in d["maestro_only"]:
            lines.append(f"| `{r['test']}` | {r['gloo']} | `{r['gloo_detail'].replace('|', chr(92) + '|')}` |")
        lines.append("")

    lines += [
        "## How maestro gets to run the tests",
        "",
        "distributed_test.py decides at import time which tests a backend runs, from its name (`BACKEND`) and "
        "from the feature sets in `DistTestCases`. Before importing it, the harness adds maestro to the sets for "
        "what maestro implements (README.md, \"Supported operations\"), as third-party backends such as torch-ucc "
        f"do: {', '.join(f'`{s}`' for s in d['feature_sets'])} (not `gpu` / `cuda`: those tests need a GPU per rank; maestro's "
        "CUDA tensors, staged through host memory, are tested on a GPU by scripts/gpu_check.sh). "
        "It leaves `skip_collective` alone (maestro implements reduce, all_gather_coalesced, recv from any source "
        "and the CPU barrier), and adds maestro to the profiler allow-lists, since its work objects carry "
        "`maestro:<collective>` profiling titles as gloo's carry `gloo:<collective>`.",
        "",
        "Some tests are gated on the backend's *name* for a feature maestro has. The harness lifts those gates "
        "(`LIFT` in tests/torch_suite/selection.py) on both backends, and only while the test's skip reason is "
        "exactly that gate; the tests run unmodified:",
        "",
        "| test | gate (maestro's skip reason) | why maestro qualifies | lifted on | gloo | maestro |",
        "|---|---|---|---|---|---|",
    ]
    for t, lf in sorted(d["lift"].items()):
        g, mo = (d["tests"][t][b]["outcome"] for b in BACKENDS)
        lines.append(f"| `{t}` | {lf['gate']} | {lf['why']} | {', '.join(lf['lifted_on'])} | {g} | {mo} |")
    lines.append("")
    not_lifted = sorted(t for t, r in d["tests"].items()
                        if r["gloo"]["outcome"] == "passed" and r["maestro"]["outcome"] == "skipped")
    lines += ["Tests gloo passes that still skip on maestro:", ""]
    if not_lifted:
        lines += ["| test | maestro's skip reason |", "|---|---|"]
        for t in not_lifted:
            lines.append(f"| `{t}` | {d['tests'][t]['maestro'].get('reason', '')} |")
    else:
        lines.append("None.")
    lines.append("")

    lines += ["## What this suite does not reach", ""] + [f"- {n}" for n in selection.NOT_REACHED] + [""]
    lines += ["## Skip list", "", "Tests the harness does not run, on either backend (`SKIP` in "
              "tests/torch_suite/selection.py):", ""]
    if d["skip_list"]:
        lines += ["| test | reason |", "|---|---|"] + [f"| `{t}` | {r} |" for t, r in sorted(d["skip_list"].items())]
    else:
        lines.append("None.")
    lines += ["", "## Why tests were skipped", "",
              "Upstream's own reasons (the suite's decorators; bug-report addresses left out), tests per backend:", "",
              "| reason | gloo | maestro |", "|---|---|---|"]
    reasons = collections.Counter()
    for b in BACKENDS:
        for r in d["tests"].values():
            if r[b]["outcome"] == "skipped":
                reasons[(r[b].get("reason", ""), b)] += 1
    for reason in sorted({k[0] for k in reasons}, key=lambda x: (-(reasons[(x, "gloo")] + reasons[(x, "maestro")]), x)):
        lines.append(f"| {reason.replace('|', chr(92) + '|')} | {reasons[(reason, 'gloo')]} | "
                     f"{reasons[(reason, 'maestro')]} |")
    lines += ["", "Every test and its outcome on each backend: "
              "[results/data/torch_suite/torch_suite.json](results/data/torch_suite/torch_suite.json).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset", choices=("full", "ci"), default="full")
    ap.add_argument("--tests", default="", help="comma-separated test names (instead of --subset)")
    ap.add_argument("-k", dest="pattern", default="", help="only tests whose name contains this")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test before its ranks are killed")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork", help="how the ranks are started")
    ap.add_argument("--write", action="store_true", help=f"record {os.path.relpath(DATA, ROOT)} and "
                                                         f"{os.path.relpath(DOC, ROOT)}")
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--render", action="store_true", help=f"only regenerate {os.path.relpath(DOC, ROOT)} from "
                                                          f"{os.path.relpath(DATA, ROOT)} (after changing its format)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each test's outcome as it ends")
    args = ap.parse_args(argv)
    if args.render:
        with open(DATA) as f, open(DOC, "w") as out:
            out.write(render(json.load(f)))
        return 0
    command = "python tests/torch_suite/run.py" + ("" if not (argv or sys.argv[1:]) else
                                                   " " + shlex.join(argv if argv is not None else sys.argv[1:]))
    backends = args.backends.split(",")
    os.makedirs(LOGS, exist_ok=True)
    t0 = time.monotonic()
    if args.tests:
        tests = args.tests.split(",")
    elif args.subset == "ci":
        tests = list(selection.CI_SUBSET)
    else:
        tests = list_tests(dict(os.environ, BACKEND="gloo"))
    if args.pattern:
        tests = [t for t in tests if args.pattern in t]
    results = {}
    wall = {}
    loaded = []
    for b in backends:
        print(f"== {b}: {len(tests)} tests (log: {os.path.relpath(os.path.join(LOGS, b + '.log'), ROOT)})",
              file=sys.stderr, flush=True)
        results[b], wall[b], metas = run_backend(b, tests, timeout=args.timeout, start=args.start, log_dir=LOGS,
                                          verbose=args.verbose)
        loaded += metas
        c = counts(results[b])
        print(f"   {b}: " + ", ".join(f"{c[k]} {k}" for k in OUTCOMES) + f" in {wall[b]:.0f} s",
              file=sys.stderr, flush=True)
    if set(backends) != set(BACKENDS):
        return 0
    regressions, fixed, maestro_only = compare(results)
    lift = {}
    for t in tests:
        on = [b for b in BACKENDS if "lifted" in results[b].get(t, {})]
        if on:
            lift[t] = {"gate": results[on[-1]][t]["lifted"], "why": selection.LIFT[t][1], "lifted_on": on}
    rec = {
        "experiment": "torch_suite", "status": "ok", "seconds": round(time.monotonic() - t0, 1),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "command": command,
        "machine": machine(),
        "data": {
            "suite": "torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase",
            "world_size": 2, "start_method": args.start, "per_test_timeout_s": args.timeout,
            "selected": len(tests),
            "selection": "tests" if args.tests else args.subset, "pattern": args.pattern,
            "extension": extension(loaded),
            "feature_sets": list(selection.FEATURES),
            "backends": {b: {"counts": counts(results[b]), "wall_s": round(wall[b], 1)} for b in BACKENDS},
            "regressions": regressions, "known_gaps_passing": fixed, "maestro_only": maestro_only,
            "lift": lift, "skip_list": {t: r for t, r in selection.SKIP.items() if t in tests},
            "tests": {t: {b: results[b][t] for b in BACKENDS} for t in tests},
        },
    }
    summary = (f"gloo: {rec['data']['backends']['gloo']['counts']}\nmaestro: "
               f"{rec['data']['backends']['maestro']['counts']}")
    print(summary, file=sys.stderr)
    unexplained = [r for r in regressions if r["test"] not in selection.KNOWN_GAPS]
    for r in regressions:
        tag = "known gap" if r["test"] in selection.KNOWN_GAPS else "NEW"
        print(f"  gloo passed, maestro {r['outcome']} ({tag}): {r['test']}: {r['error']}", file=sys.stderr)
    for t in fixed:
        print(f"  known gap now passes on maestro (remove it from KNOWN_GAPS): {t}", file=sys.stderr)
    paths = [args.json] if args.json else []
    if args.write:
        paths.append(DATA)
    for p in paths:
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        with open(p, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=False)
            f.write("\n")
    if args.write:
        with open(DOC, "w") as f:
            f.write(render(rec))
        print(f"wrote {os.path.relpath(DATA, ROOT)} and {os.path.relpath(DOC, ROOT)}", file=sys.stderr)
    return 1 if unexplained or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
