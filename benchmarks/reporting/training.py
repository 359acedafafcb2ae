"""The training sections: the models' gradient sync and DDP training, and
the load balance under background traffic."""
from __future__ import annotations

import statistics

from variants import is_gloo

from .common import busbw_of_iter, plt, save, table
from .peers import best_gloo, not_measured


def sec_models(rec, out):
    runs = rec["data"]["runs"]
    parts, labels, vals = [], [], {}
    for key, run in runs.items():
        model, mode = key.split("/")
        rows = {r["variant"]: r for r in run["rows"]}
        if mode == "buckets":
            g = best_gloo({v: r["sync_s"] for v, r in rows.items()}, lower_is_better=True)
            trs = [[v, r["sync_s"], (1 - r["sync_s"] / g[1]) * 100 if g and not is_gloo(v) else ""]
                   for v, r in rows.items()]
            parts.append(f"**{model}**, gradient buckets only ({run['parameters'] / 1e6:.1f} M parameters, "
                         f"{run['rows'][0]['buckets']} DDP buckets)\n\n"
                         + table(["backend", "sync s / iteration", f"% less than {g[0] if g else 'gloo'} (best gloo)"],
                                 trs) + not_measured(rows, run.get("not_run", ()), run.get("why_not_run", "")))
            label = f"{model}\n(sync)"
            for v, r in rows.items():
                vals.setdefault(v, {})[label] = r["sync_s"]
            labels.append(label)
        else:
            # New records: benchmarks/train.py's runs, exposed comm = backward's
            # wait for the gradient sync after its last gradient, measured in the
            # step. Older records (no exposed_comm_method) stored iteration -
            # compute there.
            measured = all("exposed_comm_method" in r for r in rows.values())
            g = best_gloo({v: r["exposed_comm_s"] for v, r in rows.items()}, lower_is_better=True)
            trs = [[v, r["iteration_s"], r["compute_s"], max(0.0, r["iteration_s"] - r["compute_s"])]
                   + ([r["exposed_comm_s"], r["samples_per_s"]] if measured else [])
                   + [(1 - r["exposed_comm_s"] / g[1]) * 100 if g and g[1] and not is_gloo(v) else ""]
                   for v, r in rows.items()]
            what = "exposed comm" if measured else "iteration − compute"
            if measured:
                r0 = run["rows"][0]
                how = (f"4 ranks sharing 2 cores, batch {r0['batch']} per rank ({r0['input']}): `{run['command']}`; "
                       + ", ".join(f"{v} with `{flags}`" for v, flags in (
                           ("gloo", "--backend gloo"), ("gloo-4dev", "--backend gloo --gloo-devices vnics"),
                           ("single", "--policy single")) if v in rows) + "; "
                       "exposed comm = backward's wait for the gradient sync after its last gradient, measured in "
                       "the step; compute = forward and backward under no_sync")
            else:
                how = "forward and backward on 4 ranks sharing 2 cores; compute = the same under no_sync"
            parts.append(f"**{model}** under DDP ({how})\n\n"
                         + table(["backend", "iteration s", "compute s", "iteration − compute s"]
                                 + (["exposed comm s", "samples/s"] if measured else [])
                                 + [f"% less {what} than {g[0] if g else 'gloo'} (best gloo)"], trs)
                         + not_measured(rows, run.get("not_run", ()), run.get("why_not_run", "")))
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / max(1, len(vals))
    for i, (v, ys) in enumerate(vals.items()):
        xs = [x for x, label in enumerate(labels) if label in ys]
        ax.bar([x + i * width for x in xs], [ys[labels[x]] for x in xs], width, label=v)
    ax.set_xticks([x + width * (len(vals) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel("seconds per iteration")
    ax.legend()
    return ("Models (paper Fig. 11)", "Gradient synchronisation per iteration on 4 ranks of the pinned lab.\n\n"
            + "\n\n".join(parts) + "\n\n" + save(fig, out, "models"))


def path_bytes(iters: list, peer: int) -> dict:
    first, last = iters[0]["paths"], iters[-1]["paths"]
    f = {p["path"]: p["bytes_sent"] for p in first if p["peer"] == peer}
    return {p["path"]: p["bytes_sent"] - f[p["path"]] for p in last if p["peer"] == peer}


def sec_load_balance(rec, out):
    d = rec["data"]
    residual = d["residual_mbit"]
    share_res = [r / sum(residual) for r in residual]
    trs, shares = [], {}
    bws = load_balance_busbw(d)
    for policy, run in d["runs"].items():
        if "paths" in run["ranks"][1][0]:  # maestro: rank 1 writes to rank 2 across the loaded spines
            b = path_bytes(run["ranks"][1], 2)
            tot = sum(b.values()) or 1
            shares[policy] = [b[p] / tot for p in sorted(b)]
        cells = [f"{s:.2f}" for s in shares[policy]] if policy in shares else ["-"] * 4  # gloo: no per-path counts
        bw = bws.get(policy)
        trs.append([policy, bw if bw else "-", bw / (sum(residual) / 8) if bw else "-", *cells])
    ad = next((r for r in trs if r[0] == "adaptive"), None)
    rr = next((r for r in trs if r[0] == "round_robin"), None)
    g = best_gloo(bws)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / (len(shares) + 1)
    ax.bar([s - 0.4 + width / 2 for s in range(4)], share_res, width, label="residual capacity", color="black")
    for i, (p, sh) in enumerate(shares.items()):
        ax.bar([s - 0.4 + width * (i + 1.5) for s in range(4)], sh, width, label=p)
    ax.set_xticks(range(4), [f"spine {s}\n({d['background_mbit'].get(str(s), 0)} Mbit bg)" for s in range(4)])
    ax.set_ylabel("share of bytes")
    ax.legend(fontsize=8)
    note = ""
    if ad and rr:
        note = (f"adaptive reaches **{ad[2]:.2f} x the residual capacity** and **{ad[1] / rr[1]:.2f} x round_robin**"
                + (f", **{ad[1] / g[1]:.2f} x {g[0]}** (the best gloo). " if g else ". "))
    return ("Load balance under background traffic (paper Fig. 12c)",
            f"Allreduces of {next(iter(d['runs'].values()))['bytes'] >> 20} MiB in a loop; UDP background at "
            f"{', '.join(f'{m} Mbit/s on spine {s}' for s, m in d['background_mbit'].items())} "
            f"(h1 to h3); the ring's 1-to-2 crossing shares those links. Residual capacity "
            f"{sum(residual)} Mbit/s = {sum(residual) / 8:.1f} MB/s. {note}\n\n"
            + table(["variant", "busbw MB/s", "x residual", *[f"spine {s} share" for s in range(4)]],
                    trs + [["residual capacity", sum(residual) / 8, 1.0, *[f"{s:.2f}" for s in share_res]]])
            + not_measured(d["runs"]) + "\n\n" + save(fig, out, "load_balance"))


def load_balance_busbw(d: dict) -> dict:
    """{variant: median busbw MB/s of rank 1's iterations after the first};
    a variant with no iteration after the first has none (sanity() says so)."""
    return {v: statistics.median(busbw_of_iter(x, run["bytes"], run["world"]) for x in run["ranks"][1][1:])
            for v, run in d["runs"].items() if run["ranks"][1][1:]}
