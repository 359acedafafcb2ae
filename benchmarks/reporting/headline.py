"""The headline: maestro's default policy against the best gloo of each
row, at the top of docs/results.md and between README.md's results markers."""
from __future__ import annotations

import statistics

from variants import maestro_policy

from .common import runs_of, size_label, table
from .peers import best_gloo, congestion_variant, ecmp_label, gloo_cell
from .sweeps import spines_cells
from .training import load_balance_busbw

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def headline(recs: dict) -> list[list]:
    """The README's rows: maestro (the default policy) against the best gloo
    configuration measured for that row, named."""
    rows = []
    col = recs.get("collectives")
    if col and col["status"] == "ok":
        limit = col["data"]["physical_limit_GBps"] * 1e3
        for mode in ("pinned", "ecmp"):
            run = col["data"]["runs"].get(f"{mode}/allreduce")
            if not run:
                continue
            sizes = {r["bytes"] for r in run["rows"]}
            top = 64 << 20 if 64 << 20 in sizes else max(sizes)  # 64 MiB: the headline size
            # and 1 MiB, a mid-size message (FSDP shards, small buckets): the default only
            for size in [top] + ([1 << 20] if 1 << 20 in sizes and top != 1 << 20 else []):
                get = {r["variant"]: r["busbw_GBps"] * 1e3 for r in run["rows"] if r["bytes"] == size}
                g = best_gloo(get)
                other = congestion_variant(get)
                shown = [("adaptive", "")]
                if size == top:
                    shown.append((other, f", MAESTRO_TCP_CONGESTION={maestro_policy(other)[1]}"))
                for variant, how in shown:
                    if variant not in get:
                        continue
                    m = get[variant]
                    rows.append([f"allreduce {size_label(size)} busbw, " + (ecmp_label(run) if mode == "ecmp" else mode)
                                 + how, f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f})",
                                 gloo_cell(g, get, "{:.0f} MB/s", run.get("not_run", ())),
                                 f"**{m / g[1]:.2f}x**" if g else "-", "≥ 2x on collectives"])
    sp = recs.get("spines")
    if sp and sp["status"] == "ok":
        limit = sp["data"]["physical_limit_GBps"] * 1e3
        cells = spines_cells(sp["data"])
        size = max(b for _, b in cells)
        get = {v: statistics.median(xs) for (v, b), xs in cells.items() if b == size}
        g = best_gloo(get)
        if "adaptive" in get:
            m = get["adaptive"]
            rows.append([f"allreduce {size >> 20} MiB busbw, ECMP, {sp['data']['spines']} spines and "
                         f"{sp['data']['aliases']} vNICs, defaults (paths=auto)",
                         f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f}); "
                         f"{m / get['adaptive@paths=4']:.2f}x one path per vNIC" if "adaptive@paths=4" in get else
                         f"{m:.0f} MB/s ({m / limit:.0%} of {limit:.0f})",
                         gloo_cell(g, get, "{:.0f} MB/s"), f"**{m / g[1]:.2f}x**" if g else "-",
                         "≥ 2x on collectives"])
    mod = recs.get("models")
    if mod and mod["status"] == "ok":
        for key, run in mod["data"]["runs"].items():
            field = "sync_s" if key.endswith("buckets") else "exposed_comm_s"
            r = {x["variant"]: x[field] for x in run["rows"]}
            g = best_gloo(r, lower_is_better=True)
            if "adaptive" not in r or not g:
                continue
            m = r["adaptive"]
            what = "gradient sync" if key.endswith("buckets") else "exposed comm (DDP)"
            rows.append([f"{key.split('/')[0]} {what} per iteration", f"{m:.2f} s", gloo_cell(g, r, "{:.2f} s", run.get("not_run", ())),
                         f"**{(1 - m / g[1]) * 100:.0f} % less**", "up to 66.7 % less transport time"])
    lb = recs.get("load_balance")
    if lb and lb["status"] == "ok":
        bws = load_balance_busbw(lb["data"])
        g = best_gloo(bws)
        if "adaptive" in bws:
            m = f"{bws['adaptive']:.0f} MB/s (adaptive)"
            if "round_robin" in bws:
                m += f"; {bws['adaptive'] / bws['round_robin']:.2f}x round_robin"
            rows.append(["allreduce busbw with background on 3 spines", m, gloo_cell(g, bws, "{:.0f} MB/s"),
                         f"**{bws['adaptive'] / g[1]:.2f}x**" if g else "-", "load follows residual capacity"])
    return rows


HEADLINE = ["maestro", "best gloo (which)", "maestro vs best gloo", "paper's claim"]


def update_readme(readme: str, recs: dict) -> None:
    text = open(readme).read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} not found")
    # A simulation and the GPU machine's loopback: not the lab's headline.
    recs = {k: r for k, r in recs.items() if k not in ("fabric_sim", "gpu")}
    rows = headline(recs)
    runs = runs_of(recs, recs)
    commands = list(dict.fromkeys((cmd, c) for cmd, c, _ in runs))
    commits = list(dict.fromkeys(c for _, c in commands))
    if len(commits) == 1:  # one run at one commit, as a record should be
        source = ", ".join(f"`{cmd}`" for cmd, _ in commands) + f" at maestro {commits[0]}"
    else:
        source = "; ".join(f"`{cmd}` at maestro {c}" for cmd, c in commands) + f" ({len(commits)} commits)"
    dates = sorted({d for _, _, d in runs})
    block = (f"{BEGIN}\n" + table(["measure (namespace leaf-spine lab, 4 ranks)"] + HEADLINE, rows)
             + f"\n\nFrom {source}, on {dates[0] if dates[0] == dates[-1] else dates[0] + ' to ' + dates[-1]}; "
               f"details, plots and commands in [docs/results.md](docs/results.md).\n{END}")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    open(readme, "w").write(text[:start] + block + text[end:])
