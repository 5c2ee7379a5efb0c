"""Source sets written straight from DESIGN.md's table, independent of lime_arch.routers."""
from lime_arch import ROUTERS


def router_specs() -> list[str]:
    """Every registered router, with a small integer for the parameterised families."""
    return [f"{n}-2" if c.takes_arg else n for n, c in ROUTERS.items()]


def expected_sources(spec: str, l: int) -> set[int]:
    name, _, arg = spec.rpartition("-") if spec.split("-")[-1].isdigit() else (spec, "", "")
    j = int(arg) if arg else None
    if name == "none":
        return {l}
    if name in ("full", "average", "no-head-mix", "per-dim"):
        return set(range(l + 1))
    if name == "last":
        return set(range(max(0, l - j + 1), l + 1))
    if name == "first":
        return set(range(min(j, l + 1))) | {l}
    if name == "dilated":
        return {s for s in range(l + 1) if s % j == 0} | {l}
    raise AssertionError(f"test table has no entry for router {spec!r}: add it")
