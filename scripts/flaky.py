#!/usr/bin/env python3
"""The helper of scripts/flaky.sh: runs a test binary or a pytest module,
records every test's outcome, and prints the failure rate of each test.

  flaky.py gtest  --out DIR --group NAME --repeat N [--filter F] [--test-timeout S] -- BINARY [ENV=VALUE ...]
  flaky.py pytest --out DIR --group NAME --xml FILE --log FILE --rc RC
  flaky.py report --out DIR [--all]

Every outcome is a line of DIR/results.jsonl ({"group", "test", "failed"}).
The first failing output of each test is kept in DIR/failures/ and named in
the report. Only the standard library: no torch or pytest needed here.
"""
import argparse
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

RUN = re.compile(r"^\[ RUN      \] (\S+)")
ITERATION_DONE = re.compile(r"^\[==========\] \d+ tests? from .* ran\.")
DONE = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+) \(\d+ ms\)")


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Recorder:
    def __init__(self, out, group):
        self.out, self.group = out, group
        os.makedirs(os.path.join(out, "failures"), exist_ok=True)
        self.results = open(os.path.join(out, "results.jsonl"), "a")

    def record(self, test, failed, output=""):
        entry = {"group": self.group, "test": test, "failed": failed}
        if failed:
            path = os.path.join(self.out, "failures", safe(f"{self.group}__{test}") + ".txt")
            if not os.path.exists(path):  # the first failing output is the one kept
                with open(path, "w") as f:
                    f.write(output)
            entry["log"] = path
        self.results.write(json.dumps(entry) + "\n")
        self.results.flush()


def pump(stream, lines):
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_gtest(args):
    """Runs the binary with --gtest_repeat/--gtest_shuffle until `repeat`
    iterations are done: a test that crashes the process (a sanitizer report
    halts it) or outlives --test-timeout is a failure, and a new process
    goes on with the iterations left."""
    rec = Recorder(args.out, args.group)
    env = dict(os.environ)
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    left = args.repeat
    log_path = os.path.join(args.out, safe(args.group) + ".log")
    with open(log_path, "a") as log:
        while left > 0:
            seed = random.randint(1, 99999)
            cmd = [args.binary, f"--gtest_repeat={left}", "--gtest_shuffle", f"--gtest_random_seed={seed}"]
            if args.filter:
                cmd.append(f"--gtest_filter={args.filter}")
            log.write(f"\n=== {' '.join(cmd)}\n")
            log.flush()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, text=True, errors="replace")
            lines = queue.Queue()
            threading.Thread(target=pump, args=(p.stdout, lines), daemon=True).start()
            current, output, started = None, [], time.monotonic()
            finished, recorded, failed, why = 0, 0, 0, None
            while True:
                try:
                    line = lines.get(timeout=5)
                except queue.Empty:
                    if current and why is None and time.monotonic() - started > args.test_timeout:
                        why = f"killed: still running after {args.test_timeout:g} s"
                        os.killpg(p.pid, signal.SIGKILL)
                    continue
                if line is None:
                    break
                log.write(line)
                if ITERATION_DONE.match(line):
                    finished += 1
                m = RUN.match(line)
                if m:
                    current, output, started = m.group(1), [line], time.monotonic()
                    continue
                if current:
                    output.append(line)
                    d = DONE.match(line)
                    if d and d.group(2) == current:
                        if d.group(1) != "SKIPPED":
                            rec.record(current, d.group(1) == "FAILED", "".join(output))
                            recorded += 1
                            failed += d.group(1) == "FAILED"
                        current = None
            rc = p.wait()
            if current:  # a crash (a sanitizer halts the process) or a hang
                output.append(f"\n[flaky.py] the process ended during this test ({why or f'exit status {rc}'})\n")
                rec.record(current, True, "".join(output))
                recorded += 1
                finished += 1  # that iteration is spent; a new process goes on with the rest
            elif rc != 0 and not failed:  # e.g. a leak report at exit: the process's, not a test's
                rec.record("(process)", True, f"exit status {rc} outside any test; see {log_path}\n")
                finished += finished < left
            if recorded == 0:
                print(f"error: {args.binary} ran no test (exit status {rc}); see {log_path}", file=sys.stderr)
                return 1
            left -= max(finished, 1)
    return 0


def record_pytest(args):
    """Records the outcomes of one pytest run from its JUnit XML; a run that
    left no XML (it crashed or hung) is a failure of the module."""
    rec = Recorder(args.out, args.group)
    try:
        root = ET.parse(args.xml).getroot()
    except (OSError, ET.ParseError):
        with open(args.log, errors="replace") as f:
            rec.record(f"{args.module} (no results: exit status {args.rc})", True, f.read())
        return 0
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        bad = [e for e in case if e.tag in ("failure", "error")]
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        text = "".join(f"{e.get('message', '')}\n{e.text or ''}\n" for e in bad)
        rec.record(name, bool(bad), f"{text}\n(the whole run's output: {args.log})\n")
    return 0


def report(args):
    counts = {}
    path = os.path.join(args.out, "results.jsonl")
    if not os.path.exists(path):
        print("no results recorded")
        return 1
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            c = counts.setdefault((e["group"], e["test"]), {"runs": 0, "failures": 0, "log": ""})
            c["runs"] += 1
            if e["failed"]:
                c["failures"] += 1
                c["log"] = c["log"] or e.get("log", "")
    rows = sorted(counts.items(), key=lambda kv: (-kv[1]["failures"], kv[0]))
    width = max(len(f"{g} {t}") for g, t in counts) + 2
    lines = [f"{'group test':<{width}} {'runs':>6} {'fail':>5} {'rate':>7}  first failing output"]
    for (g, t), c in rows:
        if args.all or c["failures"]:
            rate = 100.0 * c["failures"] / c["runs"]
            lines.append(f"{g + ' ' + t:<{width}} {c['runs']:>6} {c['failures']:>5} {rate:>6.1f}%  {c['log']}")
    groups = sorted({g for g, _ in counts})
    summary = []
    for g in groups:
        tests = [c for (gg, _), c in counts.items() if gg == g]
        runs = sum(c["runs"] for c in tests)
        fails = sum(c["failures"] for c in tests)
        flaky = sum(1 for c in tests if c["failures"])
        summary.append(f"{g}: {len(tests)} tests, {runs} runs, {fails} failures, {flaky} tests failed at least once")
    text = "\n".join(lines + [""] + summary) + "\n"
    with open(os.path.join(args.out, "table.txt" if args.all else "failures.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 1 if any(c["failures"] for c in counts.values()) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gtest")
    g.add_argument("--out", required=True)
    g.add_argument("--group", required=True)
    g.add_argument("--repeat", type=int, required=True)
    g.add_argument("--filter", default="")
    g.add_argument("--test-timeout", type=float, default=300)
    g.add_argument("binary")
    g.add_argument("env", nargs="*")
    p = sub.add_parser("pytest")
    for a in ("--out", "--group", "--xml", "--log", "--module"):
        p.add_argument(a, required=True)
    p.add_argument("--rc", type=int, required=True)
    r = sub.add_parser("report")
    r.add_argument("--out", required=True)
    r.add_argument("--all", action="store_true")
    args = ap.parse_args()
    return {"gtest": run_gtest, "pytest": record_pytest, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
