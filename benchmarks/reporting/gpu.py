"""The GPU section of docs/results.md, from the record benchmarks/gpu_report.py
makes of a scripts/gpu_check.sh run (docs/results/data/gpu.json; what it
holds is in gpu_report.py's docstring)."""
from __future__ import annotations

from .common import plt, save, table


def _busbw_samples(variant: dict, nbytes: int, ranks: int) -> list[float]:
    """busbw GB/s of each timing of one variant (nccl-tests' definition)."""
    return [nbytes / t / 1e9 * 2 * (ranks - 1) / ranks for t in variant.get("times_s", [variant["median_s"]])]


def _busbw_cell(variant: dict, nbytes: int, ranks: int) -> tuple[float, str]:
    bw = _busbw_samples(variant, nbytes, ranks)
    med = variant["busbw_GBps"]
    return med, (f"{med:.2f} ({min(bw):.2f}-{max(bw):.2f})" if len(bw) > 1 else f"{med:.2f}")


def section(rec: dict, out: str) -> tuple[str, str]:
    d = rec["data"]
    parts = []
    rows, plot = [], {}
    for r in d["allreduce_cuda"]:
        n, nbytes = r["ranks"], r["bytes"]
        cells = {v: _busbw_cell(r[v], nbytes, n) for v in ("maestro", "maestro-whole", "gloo", "maestro-cpu") if v in r}
        for v, (med, _) in cells.items():
            plot.setdefault(v, []).append((n, med, _busbw_samples(r[v], nbytes, n)))
        exposed, whole = r.get("copy_exposed"), r.get("copy_exposed_whole")
        rows.append([n, cells["maestro"][1], cells["maestro-whole"][1] if "maestro-whole" in cells else "-",
                     cells["gloo"][1] if "gloo" in cells else "-",
                     cells["maestro-cpu"][1] if "maestro-cpu" in cells else "-",
                     f"**{r['ratio_busbw']:.2f}x**" if "ratio_busbw" in r else "-",
                     f"{r['ratio_vs_cpu']:.2f}" if "ratio_vs_cpu" in r else "-",
                     f"{exposed:.0%}" if exposed is not None else "-",
                     f"{whole:.0%}" if whole is not None else "-", "yes" if r["ok"] else "NO"])
    if rows:
        samples = d["allreduce_cuda"][0]["maestro"]["samples"]
        parts.append(
            f"64 MiB allreduce on CUDA tensors ({d['gpu']}), every rank on this one GPU, over maestro's 4 loopback "
            f"paths: maestro (CUDA tensors staged through pinned host slabs, its defaults: copies in pieces that "
            f"overlap the ring), maestro with whole copies (MAESTRO_STAGING_PIECE=0: the tensor copied in before "
            f"the ring and back after it), gloo (CUDA tensors, its own host copies), and maestro on the same data "
            f"as CPU tensors, in the same processes, timed in interleaved blocks; busbw median (min-max) of "
            f"{samples} timings each. Copy time exposed: (CUDA op - CPU op) / CUDA op, of the medians.\n\n"
            + table(["ranks", "maestro CUDA busbw GB/s", "maestro CUDA, whole copies", "gloo CUDA busbw GB/s",
                            "maestro CPU busbw GB/s", "maestro vs gloo (CUDA)", "maestro CUDA / CPU",
                            "copy time exposed", "exposed, whole copies", "exact"], rows))
    runs = {r["run"]: r for r in d.get("determinism", [])}
    gloo_varies = {r["model"] for r in runs.values()
                   if "gloo-again" in runs and r["run"] == "gloo" and r["losses"] != runs["gloo-again"]["losses"]}
    trows = []
    whole_col = any("maestro-whole" in by for by in d["train"].values())
    for model, by in sorted(d["train"].items()):
        m, g, w = by.get("maestro"), by.get("gloo"), by.get("maestro-whole")
        if not m:
            continue

        def cell(r, key, fmt):
            return fmt.format(r[key]) if r and r.get(key) is not None else "-"
        same = "-"
        if m and g and "losses" in m and "losses" in g:
            same = "yes" if m["losses"] == g["losses"] and m.get("params_sha256") == g.get("params_sha256") else (
                "losses yes, parameters differ" if m["losses"] == g["losses"] else "NO")
        elif m and g:
            same = "not recorded (from the log)"
        if same == "NO" and model in gloo_varies:
            same = "NO, nor do two gloo runs (below)"
        row = [model, f"{m['world']} x {m['batch']} ({m['input']})", cell(m, "samples_per_s", "{:.1f}"),
               cell(g, "samples_per_s", "{:.1f}"),
               f"**{m['samples_per_s'] / g['samples_per_s']:.2f}x**" if g else "-",
               cell(m, "exposed_comm_s", "{:.3f}"), cell(g, "exposed_comm_s", "{:.3f}"),
               cell(m, "compute_s", "{:.3f}"), same]
        if whole_col:
            row[4:4] = [cell(w, "samples_per_s", "{:.1f}")]
            row[8:8] = [cell(w, "exposed_comm_s", "{:.3f}")]
        trows.append(row)
    if trows:
        full = [r for by in d["train"].values() for r in by.values() if "steps" in r]
        steps = f"{full[0]['steps']} steps ({full[0]['warmup']} warm-up)" if full else ""
        logged = sorted(f"{r['model']} on {r['backend']}" for by in d["train"].values() for r in by.values()
                        if r.get("from_log"))
        parts.append(
            f"`benchmarks/train.py --device cuda`, DDP, {trows and d['train'][trows[0][0]]['maestro']['world']} "
            f"ranks sharing the GPU, {steps}: samples/s from the median iteration; exposed communication = "
            f"iteration - the same step without the gradient sync (DDP no_sync, --compute-steps); losses and final "
            f"parameters compared step by step between the backends."
            + (f" The JSON of {', '.join(logged)} did not come back from the GPU machine; their row is the line "
               f"train.py printed in the run's log (gpu_check.log), without losses or checksums." if logged else "")
            + (" maestro, whole copies: maestro with MAESTRO_STAGING_PIECE=0 (the tensor copied in before the ring "
               "and back after it), what its default pipelined copies are measured against." if whole_col else "")
            + "\n\n"
            + table(["model", "ranks x batch", "maestro samples/s", "gloo samples/s"]
                           + (["maestro, whole copies samples/s"] if whole_col else [])
                           + ["maestro vs gloo", "maestro exposed comm s", "gloo exposed comm s"]
                           + (["maestro, whole copies exposed comm s"] if whole_col else [])
                           + ["compute alone s", "same losses and parameters"], trows))
    drows = []
    for a, b, kernels in (("gloo", "gloo-again", "cuDNN's defaults"),
                          ("maestro-deterministic", "gloo-deterministic", "deterministic (--deterministic)")):
        if a in runs and b in runs:
            ra, rb = runs[a], runs[b]
            drows.append([f"{a.split('-')[0]} vs {b.split('-')[0]}", kernels,
                          "yes" if ra["losses"] == rb["losses"] else "NO",
                          "yes" if ra.get("params_sha256") == rb.get("params_sha256") else "NO"])
    if drows:
        r0 = next(iter(runs.values()))
        parts.append(
            f"Whether two runs can have equal losses on this GPU: {r0['model']}, {r0['world']} ranks x batch "
            f"{r0['batch']}, {r0['steps']} steps, the same seed and data, run twice on gloo with cuDNN's default "
            f"kernels (whose backward may sum in any order), then on maestro and on gloo with deterministic "
            f"kernels (`train.py --deterministic`)"
            + (f"; run on its own, `scripts/gpu_check.sh --determinism` at maestro "
               f"{d['determinism_machine']['commit']} (torch {d['determinism_machine']['torch']})"
               if d.get("determinism_machine") else "")
            + ".\n\n"
            + table(["runs", "kernels", "same losses", "same final parameters"], drows))
    hrows = []
    for r in d["allreduce_cpu_host"]:
        n, nbytes = r["ranks"], r["bytes"]
        m, g = _busbw_cell(r["maestro"], nbytes, n), _busbw_cell(r["gloo"], nbytes, n)
        hrows.append([n, m[1], g[1], f"**{r['ratio_busbw']:.2f}x**", "yes" if r["ok"] else "NO"])
    if hrows:
        parts.append(
            f"A {rec['machine']['cores']}-core host: the loopback demo's 64 MiB CPU allreduce (maestro's defaults, "
            f"4 loopback paths) at more ranks than the 2-core figures above can hold, maestro vs gloo in the same "
            f"processes, interleaved blocks; busbw median (min-max).\n\n"
            + table(["ranks", "maestro busbw GB/s", "gloo busbw GB/s", "maestro vs gloo", "exact"], hrows))
    if plot:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        shown = [v for v in ("maestro", "maestro-whole", "gloo", "maestro-cpu") if plot.get(v)]
        width = 0.8 / len(shown)
        for i, v in enumerate(shown):
            pts = plot[v]
            xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(pts))]
            meds = [p[1] for p in pts]
            lo = [med - min(bw) for _, med, bw in pts]
            hi = [max(bw) - med for _, med, bw in pts]
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3,
                   label={"maestro": "maestro, CUDA", "maestro-whole": "maestro, CUDA, whole copies",
                          "gloo": "gloo, CUDA", "maestro-cpu": "maestro, CPU tensors"}[v])
        ax.set_xticks(range(len(plot["maestro"])), [f"{p[0]} ranks" for p in plot["maestro"]])
        ax.set_ylabel("busbw GB/s (median, min-max)")
        ax.set_title(f"64 MiB allreduce, ranks sharing one {d['gpu'] or 'GPU'}")
        ax.legend(fontsize=8)
        parts.append(save(fig, out, "gpu_allreduce"))
    if d.get("failed_steps"):
        parts.append("Steps of that run that failed: " + "; ".join(f"`{s}`" for s in d["failed_steps"]) + ".")
    return f"CUDA tensors on one GPU ({d['gpu']})", "\n\n".join(parts)
