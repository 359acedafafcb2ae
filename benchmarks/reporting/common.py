"""What every part of the report shares: the records, the markdown table,
the line under each section saying where its numbers come from, the PNG
plots (matplotlib, Agg), and the small formatters of sizes and spreads."""
from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401 - the sections' plots


MBYTE = 1e6


def load(folder: str) -> dict:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                rec = json.load(f)
            out[rec["experiment"]] = rec
    return out


def table(header: list[str], rows: list[list]) -> str:
    def cell(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
        return str(x)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def provenance(rec: dict) -> str:
    m = rec["machine"]
    return (f"\n*Measured {rec['date']} with `{rec['command']}` ({'quick' if rec['quick'] else 'full'} mode, "
            f"{rec['seconds']:.0f} s) on {m['cores']} cores ({m['cpu']}), {m['memory_GiB']} GiB, Linux {m['kernel']}, "
            f"torch {m['torch']}, maestro {m['maestro_commit']}"
            + (f", host load average {m['load_at_start']} at the start" if "load_at_start" in m else "")
            + f". Lab: {rec['data'].get('lab', '')}.*\n")


def runs_of(recs: dict, names) -> dict:
    """{(command, maestro commit, date): [record names]}: the runs that made
    the records `names`, in their order."""
    runs = {}
    for n in names:
        r = recs[n]
        runs.setdefault((r["command"], r["machine"]["maestro_commit"], r["date"][:10]), []).append(n)
    return runs


def save(fig, out: str, name: str) -> str:
    path = os.path.join(out, "results", f"{name}.png")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![{name}](results/{name}.png)"


def busbw_of_iter(it: dict, nbytes: int, world: int) -> float:
    return nbytes / it["seconds"] * 2 * (world - 1) / world / MBYTE


def size_label(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    return f"{nbytes / 1024:g} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"


def spread_cell(med: float, values: list[float], fmt: str = "{:.1f}") -> str:
    """'median (min-max)'."""
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"
