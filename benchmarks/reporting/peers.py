"""The peers maestro is measured beside (gloo, gloo-4dev, single), the best
gloo of a row, and the names of a sweep's ECMP settings and congestion
control variants."""
from __future__ import annotations

from variants import is_gloo


# The peers of maestro in the collectives, models and load_balance
# experiments (benchmarks/suite.py): gloo with one device, gloo with one
# device per vNIC address, maestro on one path. Records made before the suite
# measured them lack some; the report says which instead of showing numbers.
GLOO_PEERS = ("gloo", "gloo-4dev")


PEERS = GLOO_PEERS + ("single",)


def routed(run: dict) -> bool | None:
    """Whether discovery ran in every maestro group of a sweep (some path of
    the group has a probed route), or None for records made before sweeps
    recorded their routes (they asked for discovery explicitly)."""
    groups = run.get("routes")
    if groups is None:
        return None
    return all(any(r for paths in peers.values() for r in paths) for peers in groups.values())


def ecmp_settings(run: dict) -> str:
    """How maestro's groups of an ECMP sweep found their routes."""
    found = routed(run)
    if found is None:
        return "ECMP mode: maestro groups use MAESTRO_DISCOVERY=ttl"
    if not found:
        return "ECMP mode, maestro's defaults: discovery did NOT run in every maestro group"
    variant = "adaptive" if "adaptive" in run["routes"] else next(iter(run["routes"]))
    crossing = sorted((peer, paths) for peer, paths in run["routes"][variant].items() if any(paths))
    spines = ", ".join(f"{len({r for r in paths if r})} distinct spines for {len(paths)} paths (rank {peer})"
                       for peer, paths in crossing)
    return (f"ECMP mode, maestro's defaults: discovery ran by itself (auto); {variant}'s paths from rank 0 to the "
            f"ranks across the core took {spines}")


def ecmp_label(run: dict | None) -> str:
    """The ECMP rows' name in the headline and targets tables."""
    found = routed(run) if run else None
    if found is None:
        return "ecmp + discovery"
    return "ecmp, defaults (discovery auto)" if found else "ecmp, defaults (no discovery)"


def best_gloo(values: dict, lower_is_better: bool = False) -> tuple[str, float] | None:
    """(variant, value) of the best gloo configuration among `values`
    ({variant: figure}, None = no figure), or None when no gloo variant has
    one. Higher is better (bandwidth) unless lower_is_better (seconds)."""
    figures = {v: x for v, x in values.items() if is_gloo(v) and x is not None}
    if not figures:
        return None
    pick = (min if lower_is_better else max)(figures, key=figures.get)
    return pick, figures[pick]


def missing_peers(variants, not_run=()) -> list[str]:
    """The peers a record lacks, but for those its experiment leaves out on
    purpose (not_run)."""
    return [p for p in PEERS if p not in variants and p not in not_run]


def not_measured(variants, not_run=(), why="") -> str:
    """A note naming the peers a record lacks ('' when it has them all), and
    why the ones not_run were left out (why)."""
    missing = missing_peers(variants, not_run)
    left_out = [p for p in not_run if p not in variants]
    return ((f"\n\n*Not measured in this record: {', '.join(missing)} (a run of the current suite adds "
             f"{'it' if len(missing) == 1 else 'them'}).*" if missing else "")
            + (f"\n\n*Not run here: {', '.join(left_out)} ({why}).*" if left_out and why else ""))


def gloo_cell(best: tuple[str, float] | None, variants, fmt: str, not_run=()) -> str:
    """The headline's gloo column: the best gloo figure and which gloo it was,
    and the gloo peers the record lacks (but for those left out on purpose)."""
    missing = [p for p in GLOO_PEERS if p not in variants and p not in not_run]
    text = f"{fmt.format(best[1])} ({best[0]})" if best else "not measured"
    return text + (f"; {', '.join(missing)} not measured" if best and missing else "")


def congestion_variant(variants) -> str:
    """The variant the collectives run times beside the default's
    congestion control: adaptive+kernel (the kernel's default), or in
    records before it, adaptive+cubic."""
    return next((v for v in ("adaptive+kernel", "adaptive+cubic") if v in variants), "adaptive+kernel")
