"""The fabric simulator's section of docs/results.md and its plots, from
docs/results/data/fabric_sim.json (benchmarks/fabric_sim.py)."""
from __future__ import annotations

from .common import plt, save, table

STYLE = {"gloo": "s--", "k-even": "^-", "maestro": "o-", "defaults": "D-", "spray": "k:"}


def label(r: dict) -> str:
    if r["policy"] == "defaults":
        return "maestro defaults"
    return r["policy"] + (f" k={r['k']}" if r["policy"] in ("k-even", "maestro") else "")


def spread(q: dict) -> str:
    return f"{q['median']:.2f} ({q['p10']:.2f}-{q['p90']:.2f})"


def pick(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def band(ax, xs, rows, name):
    med = [r["fraction"]["median"] for r in rows]
    ax.plot(xs, med, STYLE.get(rows[0]["policy"], "o-"), label=name)
    ax.fill_between(xs, [r["fraction"]["p10"] for r in rows], [r["fraction"]["p90"] for r in rows], alpha=0.2)


def lab_shape(f: dict) -> str:
    return (f"{f['ranks']} hosts on {f['leaves']} leaves, {f['spines']} spines, core {f['core_gbps'] * 1e3:.0f} "
            f"Mbit/s, access {f['access_gbps'] * 1e3:.0f} Mbit/s")


def validation_table(rows) -> str:
    return table(["lab variant", "sim policy", "efficiency", "sim busbw MB/s median (p10-p90)",
                  "measured MB/s, fastest iteration", "sim / fastest", "within 10 %", "measured MB/s, median",
                  "sim / median"],
                 [[r["variant"], f"{label(r)} k={r['k']}" if r["policy"] == "defaults" else f"{r['policy']} k={r['k']}",
                   r["efficiency"], spread(r["sim_MBps"]), r["measured_MBps"], f"{r['ratio']:.3f}",
                   "yes" if r["within_10pct"] else "**no**",
                   r["measured_median_MBps"] if "measured_median_MBps" in r else "-",
                   f"{r['ratio_to_median']:.3f}" if "ratio_to_median" in r else "-"] for r in rows])


def grid(rows, xkey, xs, series) -> list[list]:
    """One table row per x, one cell (median (p10-p90)) per series."""
    out = []
    for x in xs:
        cells = []
        for s in series:
            hit = [r for r in rows if r[xkey] == x and label(r) == s]
            cells.append(spread(hit[0]["fraction"]) if hit else "")
        out.append([x] + cells)
    return out


def section(rec: dict, out: str):
    d = rec["data"]
    parts = []
    v = d.get("validation")
    if v:
        parts.append(
            f"**Validation against the lab** ({lab_shape(v['fabric'])}, packed: the ring crosses "
            f"the core twice; {v['bytes'] >> 20} MiB allreduce, ECMP mode; measured: {v['source']}). The simulated "
            f"rates are multiplied by each transport's efficiency measured point to point on the lab "
            f"(docs/results/data/p2p_paths.json: payload rate / link rate, gloo {v['efficiency']['gloo']:.3f}, "
            f"maestro {v['efficiency']['maestro']:.3f}); nothing is fitted to the allreduce rows. The fluid model "
            "has no reduction cost or step synchronisation, which is what remains between it and maestro's "
            "measured allreduce. The model gives the rate the fabric allows, so it is held to the run's fastest "
            "iteration; the run's median, which also carries the host's noise and TCP's loss recoveries, is "
            "shown beside it.\n\n"
            + validation_table(v["rows"]))
        sp = v.get("spines")
        if sp:
            parts.append(
                f"**Validation with more spines than vNICs** ({lab_shape(sp['fabric'])}, 4 aliases per host, ECMP, "
                f"packed; {sp['bytes'] >> 20} MiB allreduce; "
                f"measured: {sp['source']}, the fastest iteration of any trial and the median over trials): "
                "maestro's defaults (paths=auto, simulated with the engine's survey and rule) against one path "
                "per vNIC and gloo, with the same efficiencies.\n\n" + validation_table(sp["rows"]))
    scale, ksw, fails = d["scale"], d["k_sweep"], d["failures"]
    access = d["access_gbps"]
    fabrics = d["fabrics"]
    fast = [r for r in scale + ksw + fails if r["placement"] == "packed" and r["core_gbps"] >= access]
    slow = [fb for fb in fabrics if fb["core_gbps"] < access and "packed" in fb["placements"]]
    cases = []
    if fast:
        lo = min(r["fraction"]["min"] for r in fast)
        cases.append(f"**packed, fast core** (core links as fast as access links): the ring crosses the core once "
                     f"per leaf, so no two crossing flows share an uplink or a downlink and ECMP has nothing to "
                     f"collide, and one flow fills its NIC: every policy is at ideal, multipath has nothing to add "
                     f"(lowest fraction of ideal over every such run, all ranks, k, failures, seeds and policies: "
                     f"**{lo:.3f}**; no tables)")
    if slow:
        fb = slow[0]
        ratio = fb["core_gbps"] / access
        last = max(r["ranks"] for r in scale)
        at = {(r["spines"], label(r)): r["fraction"]["median"] for r in pick(fails, placement="packed", failed=0)
              if r["core_gbps"] < access}
        k = d["k"]
        probs = []
        for f in slow:
            distinct = 1.0
            for i in range(k):
                distinct *= (f["spines"] - i) / f["spines"]
            probs.append(f"{1 - distinct:.0%} with {f['spines']} spines")
        cases.append(
            f"**packed, slow core** (each core link {ratio:g} of the access link: one flow cannot fill a NIC; "
            f"the lab's case, 1 Gbit/s access over 200 Mbit/s spine links, at scale): 400 Gbit/s NICs on a fabric "
            f"of 100 Gbit/s links, or 100G NICs on 25G uplinks, modelled as {access:g} and {fb['core_gbps']:g} "
            f"(fractions of ideal depend only on the ratio). In 400G terms, "
            + "; ".join(f"{f['spines']} spines is a leaf with {d['ranks_per_leaf']} x {400:g}G down and "
                           f"{f['spines']} x {400 * f['core_gbps'] / access:g}G up, {f['oversubscription']:g}:1"
                           for f in slow)
            + " (1:1 is a 12.8 Tbit/s switch split 16 x 400G + 64 x 100G, and each spine needs one 100G port per "
            "leaf, 64 at 1,024 ranks)"
            + f". The crossing flows still share no core link, so the question is how many core links one peer's "
            f"traffic spans: gloo's one flow gets {ratio:g} of ideal; maestro's {k} paths on distinct spines "
            f"(discovery) fill the NIC; k-even's {k} hashed flows share a spine (in one pair) with probability "
            + ", ".join(probs) + f", and the ring step waits for the slowest of the {last // d['ranks_per_leaf']} "
            f"crossing pairs, so at {last:,} ranks some pair nearly always collides and k-even sits at 1/2 of ideal "
            f"(two of a pair's flows on one spine) or 1/3 (three). Failed links on rank 0's leaf change nothing: "
            f"its remaining spines still give maestro {k} distinct paths and spraying more than the NIC. At 16 "
            f"ranks (one leaf) nothing crosses the core. Median at {last:,} ranks: "
            + "; ".join(f"{f['spines']} spines: " + ", ".join(f"{s} {v:.2f}" for (sp, s), v in at.items()
                                                              if sp == f["spines"]) for f in slow))
    if any(p == "scattered" for fb in fabrics for p in fb["placements"]):
        cases.append("**scattered** (ranks on random hosts, a fragmented cluster or a topology-blind scheduler): a "
                     "leaf has up to ranks-per-leaf crossing flows and the ECMP hash decides how they share its "
                     "uplinks: collisions, even with core links as fast as access links")
    if cases:
        parts.append("Three cases, each with busbw as a fraction of ideal (spraying, no failures, on the same fabric "
                     "and placement):\n\n" + "\n".join(f"* {c}." for c in cases))
    for fb in fabrics:
        spines, core = fb["spines"], fb["core_gbps"]
        head = (f"{spines} spines, {d['ranks_per_leaf']} ranks per leaf, access {access:g} Gbit/s, core "
                f"{core:g} Gbit/s: oversubscription {fb['oversubscription']:g}:1")
        for placement in fb["placements"]:
            if placement == "packed" and core >= access:
                continue  # at ideal throughout: summarised above
            sc = pick(scale, spines=spines, core_gbps=core, placement=placement)
            ks = pick(ksw, spines=spines, core_gbps=core, placement=placement)
            fl = pick(fails, spines=spines, core_gbps=core, placement=placement)
            fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
            if sc:
                ranks = sorted({r["ranks"] for r in sc})
                series = list(dict.fromkeys(label(r) for r in sc))
                for s in series:
                    band(axes[0], ranks, [next(r for r in sc if r["ranks"] == n and label(r) == s) for n in ranks], s)
                axes[0].set_xscale("log", base=2)
                axes[0].set_xlabel("ranks")
                parts.append(f"**{head}, {placement}**: busbw as a fraction of ideal, median (p10-p90) over "
                             f"{d['seeds']} seeds, vs ranks\n\n" + table(["ranks"] + series, grid(sc, "ranks", ranks,
                                                                                                     series)))
            if ks:
                kvals = sorted({r["k"] for r in ks if r["policy"] in ("k-even", "maestro")})
                for pol in ("k-even", "maestro"):
                    rows = [r for r in ks if r["policy"] == pol]
                    if rows:
                        band(axes[1], [r["k"] for r in rows], rows, pol)
                for r in ks:
                    if r["policy"] in ("gloo", "spray", "defaults"):
                        axes[1].axhline(r["fraction"]["median"], ls=STYLE[r["policy"]][1:],
                                        color="tab:red" if r["policy"] == "defaults" else "gray", label=label(r))
                axes[1].set_xlabel("k (paths or flows per peer)")
                axes[1].set_xscale("log", base=2)
                n = ks[0]["ranks"]
                trs = [[k] + [spread(r["fraction"]) if r else "" for r in
                              (next(iter(pick(ks, policy=p, k=k)), None) for p in ("k-even", "maestro"))]
                       for k in kvals]
                auto = pick(ks, policy="defaults")
                parts.append(f"vs k at {n} ranks (gloo: {spread(pick(ks, policy='gloo')[0]['fraction'])}"
                             + (f"; maestro defaults: {spread(auto[0]['fraction'])} with "
                                f"{auto[0]['paths']['median']:g} paths, median" if auto else "") + ")\n\n"
                             + table(["k", "k-even", "maestro"], trs) if pick(ks, policy="gloo") else "")
            if fl:
                failed = sorted({r["failed"] for r in fl})
                series = list(dict.fromkeys(label(r) for r in fl))
                for s in series:
                    band(axes[2], failed, [next(r for r in fl if r["failed"] == x and label(r) == s) for x in failed], s)
                axes[2].set_xlabel(f"failed leaf-spine links ({d['failure_spread']})")
                axes[2].set_xticks(failed)
                parts.append(f"with failed leaf-spine links at {fl[0]['ranks']} ranks (on "
                             f"{'the leaf of rank 0' if d['failure_spread'] == 'leaf0' else 'random leaves'}; ideal "
                             "stays the fabric without failures)\n\n"
                             + table(["failed links"] + series, grid(fl, "failed", failed, series)))
            for ax, title in zip(axes, ("vs ranks", "vs k", "vs failed links")):
                ax.set_ylabel("busbw / ideal")
                ax.set_ylim(0, 1.05)
                ax.set_title(f"{spines} x {core:g}G spines ({fb['oversubscription']:g}:1), {placement}: {title}",
                             fontsize=9)
                ax.legend(fontsize=7)
            parts.append(save(fig, out, f"fabric_sim_{spines}x{core:g}_{placement}"))
    return ("Projection to 1,024 ranks: flow-level fabric simulator",
            "Ring allreduce on a two-tier leaf-spine fabric under ECMP, simulated at flow level "
            "(`benchmarks/fabric_sim.py`: max-min fair rates by water-filling, recomputed as flows finish; the "
            "model and its choices are in the module's docstring). Policies: **gloo** one connection per peer; "
            f"**k-even** k connections per peer each carrying 1/k, hashed independently (NCCL's QPs per "
            f"connection, E-ECMP); **maestro** k paths per peer placed by discovery ({d['candidates']} candidates "
            "per path) with the adaptive split; **maestro defaults** maestro as it comes, with "
            f"{d.get('vnics', 4)} vNICs per host: MAESTRO_PATHS=auto counts the spines with the set-up's route "
            "probes (the engine's rule: rounds of probes until one finds no new spine) and opens one path per "
            "spine, at most 16, where that is more than the vNICs, then as maestro; "
            "**spray** ideal packet spraying. Ideal = the same fabric and "
            "placement with spraying and no failures. Reproduce with the command below (then "
            "`python benchmarks/report.py`).\n\n" + "\n\n".join(p for p in parts if p))
