"""Source sets written straight from the router table (the paper's ablations, arXiv 2502.09245
Appendix F/G), independent of lime_arch.routers; the list of routers comes from the registry, so
a new router fails here until its expected sources are added."""
from lime_arch.routers import router_specs as registered_specs


def router_specs() -> list[str]:
    """Every registered router, with a small integer for the parameterised families."""
    return registered_specs((2,))


def expected_sources(spec: str, l: int) -> set[int]:
    name, _, arg = spec.rpartition("-") if spec.split("-")[-1].isdigit() else (spec, "", "")
    j = int(arg) if arg else None
    if name == "none":
        return {l}
    if name in ("full", "average", "no-head-mix", "per-dim", "depth-attention", "dynamic"):
        return set(range(l + 1))
    if name in ("last", "dynamic-last"):
        return set(range(max(0, l - j + 1), l + 1))
    if name in ("first", "dynamic-first"):
        return set(range(min(j, l + 1))) | {l}
    if name == "dilated":
        return {s for s in range(l + 1) if s % j == 0} | {l}
    raise AssertionError(f"test table has no entry for router {spec!r}: add it")
