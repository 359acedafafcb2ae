"""The names of the process groups a benchmark compares (its "variants"),
shared by the rank side (rank_bench.py, which builds them) and the report
(benchmarks/reporting/, whose peers.py sorts them into maestro and its gloo
peers). No torch here: the report runs without it.

    gloo            gloo with one device (the default interface's address)
    gloo-<n>dev     gloo with one device on each of the rank's first n vNIC addresses
    <policy>[+cc]   maestro with that load-balancing policy, optionally a TCP
                    congestion control for its paths, e.g. "adaptive+cubic"
    ...@knob=value  maestro with one more Options field (a knob's effect
                    beside the defaults), e.g. "adaptive@min_chunk_size=256K"
    ...#<name>      one more group of the same configuration, e.g.
                    "round_robin#2" beside "round_robin": what two groups that
                    differ in nothing read apart (a sweep's resolution)
"""
from __future__ import annotations

MAESTRO_POLICIES = ("adaptive", "round_robin", "weighted", "latency", "single")


def configuration(variant: str) -> str:
    """The variant without its twin's name: "round_robin#2" -> "round_robin"."""
    return variant.partition("#")[0]


def gloo_device_count(variant: str) -> int | None:
    """"gloo-<n>dev" -> n, else None."""
    variant = configuration(variant)
    if variant.startswith("gloo-") and variant.endswith("dev") and variant[5:-3].isdigit():
        return int(variant[5:-3])
    return None


def is_gloo(variant: str) -> bool:
    return configuration(variant) == "gloo" or gloo_device_count(variant) is not None


def is_maestro(variant: str) -> bool:
    return not is_gloo(variant)


def maestro_policy(variant: str) -> tuple[str, str]:
    """"adaptive+cubic" -> ("adaptive", "cubic"); "adaptive" -> ("adaptive", "")."""
    policy, _, congestion = configuration(variant).partition("@")[0].partition("+")
    return policy, congestion


def maestro_knobs(variant: str) -> dict[str, str]:
    """"adaptive@min_chunk_size=256K" -> {"min_chunk_size": "256K"}; {} without "@"."""
    out = {}
    for field in configuration(variant).split("@")[1:]:
        name, eq, value = field.partition("=")
        if not eq or not name:
            raise ValueError(f"variant {variant!r}: expected @knob=value, got @{field}")
        out[name] = value
    return out
