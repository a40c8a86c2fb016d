"""``rotor``: the optimal persistent schedule of a heterogeneous chain (docs/chain_solvers.md).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
heterogeneous chains: how to train deep neural networks with limited memory" (2019).
The dynamic program and its two models live in :mod:`solvers._rotor_dp`; this module
decides how to run it for one budget:

1. below the model's least budget (exact in bytes): Infeasible with that budget;
2. at or above the store-all peak (tight model): store-all, optimal;
3. in units of the sizes' greatest common divisor when the table (at most
   ``max_slots`` units and ``memory_cap`` bytes) allows: exact;
4. else sizes rounded up to slots (feasible in bytes), refined up to ``max_slots`` or
   the memory cap; the relaxation (sizes rounded down) gives a lower bound and guides
   a second schedule, exact in bytes (``_rotor_dp.guided_ops``): the faster of the two
   is returned (the guided one alone where rounding up leaves no schedule), with the
   bound and the relative gap.
"""

from __future__ import annotations

import math
import os

from schedir import Chain, Schedule, discretize, simulate_chain
from schedir.chain.discretize import size_unit
from solvers.chain._rotor_dp import (
    RotorTable,
    build_table,
    guided_ops,
    least_memory,
    min_memory,
    min_memory_ops,
    no_recompute_budget,
    table_bytes,
)
from solvers.chain.store_all import store_all_ops
from solvers.registry import Infeasible, MemoryLimit, register

__all__ = [
    "RotorTable",
    "build_table",
    "default_memory_cap",
    "least_memory",
    "min_memory",
    "min_memory_ops",
    "no_recompute_budget",
    "plan_grid",
    "rotor",
    "table_bytes",
]

MODELS = ("tight", "published")
MIN_SLOTS = 16  # a coarser table is not worth building


def default_memory_cap() -> int:
    """A quarter of the machine's physical memory, bytes (4 GiB if it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (AttributeError, ValueError, OSError):  # not POSIX, or the name is unknown
        return 4 << 30


def plan_grid(chain: Chain, capped: int, *, max_slots: int, slots: int, memory_cap: int):
    """How to tabulate a chain for budgets up to ``capped`` bytes.

    Returns ``(unit, None)`` when the exact table (sizes in units of their gcd) has at
    most ``max_slots`` units and fits ``memory_cap``; else ``(None, (first, last,
    limit))``: discretize with ``first`` slots, refine up to ``last``; ``limit`` says
    what bounds ``last`` ("max_slots" or "memory_cap"). Raises MemoryLimit when even
    ``MIN_SLOTS`` slots do not fit.
    """
    fixed = table_bytes(chain, 0)
    per_unit = table_bytes(chain, 1) - fixed  # bytes per tabulated memory value
    fit = (memory_cap - fixed) // per_unit - 1  # the largest M whose table fits the cap
    unit = size_unit(chain)
    width = capped // unit - chain.in_size[0] // unit
    if capped // unit <= max_slots and width <= fit:
        return unit, None
    if fit < MIN_SLOTS:
        need = table_bytes(chain, MIN_SLOTS)
        raise MemoryLimit(
            f"rotor: the DP table of a {chain.length}-stage chain takes {per_unit} bytes per "
            f"memory slot, {need} bytes for {MIN_SLOTS} slots; memory_cap = {memory_cap} bytes"
            f" (default: a quarter of the RAM); raise memory_cap or shorten the chain"
        )
    last = min(max_slots, fit)
    return None, (min(slots, last), last, "memory_cap" if fit < max_slots else "max_slots")


def _relative_gap(value: float, bound: float) -> float:
    if value <= bound:
        return 0.0
    return (value - bound) / bound if bound > 0 else math.inf


def _discretized(chain, budget, capped, grid, limit, tight, options, rounded=None):
    """Ops and metadata of a discretized answer: the rounded-up table's schedule
    (``rounded``: (ops, value), None where rounding leaves no schedule) or the schedule
    the relaxation guides (``guided_ops``), whichever is faster, with the relaxation's
    value as lower bound; without ``lower_bound``, a least-memory schedule and the
    no-recomputation time as bound."""
    _, _, lower_bound, _, progress = options
    relaxed = discretize(chain, capped, grid, round_up=False)
    if lower_bound:
        report = None if progress is None else lambda f, text: progress(f, f"lower bound: {text}")
        guide = build_table(relaxed.chain, relaxed.budget, tight=tight, progress=report)
        bound = guide.value(relaxed.budget)
        ops = guided_ops(chain, guide, relaxed.slot_size, budget)
        how = "guided"
    else:
        bound = chain.store_all_time()
        ops = min_memory_ops(chain, budget, tight=tight) if rounded is None else None
        how = "min_memory"
    value = simulate_chain(chain, ops).makespan if ops is not None else math.inf
    meta = {"exact": False, "dp_value": None}
    if rounded is not None and rounded[1] <= value:
        ops, value = rounded
        meta["dp_value"] = value
    else:
        meta["fallback"] = how
    info = {"slot_size": relaxed.slot_size, "slots": grid, "limited_by": limit,
            "makespan": value, "lower_bound": bound,
            "relative_loss": _relative_gap(value, bound)}  # fmt: skip
    meta.update(lower_bound=bound, discretization=info)
    return ops, meta


def _solve(chain, budget, tight, options) -> tuple[tuple, dict]:
    """Ops and metadata of the DP of one model; raises Infeasible."""
    max_slots, slots, _, memory_cap, progress = options
    least = min_memory(chain, tight=tight)
    if budget < least:
        raise Infeasible("rotor", budget, least)
    top = no_recompute_budget(chain, tight=tight)
    if tight and budget >= top:  # store-all fits: nothing is faster
        return store_all_ops(chain), {"exact": True, "dp_value": chain.store_all_time()}
    capped = min(budget, top)
    unit, grids = plan_grid(chain, capped, max_slots=max_slots, slots=slots, memory_cap=memory_cap)
    if unit is not None:  # exact: sizes in units of their gcd
        exact = discretize(chain, capped, slot_size=unit)
        table = build_table(exact.chain, exact.budget, tight=tight, progress=progress)
        meta = {"exact": True, "dp_value": table.value(exact.budget)}
        if unit > 1:
            meta["size_unit"] = unit
        return table.ops(exact.budget), meta
    grid, last, limit = grids
    while True:
        slot = discretize(chain, capped, grid)
        if min_memory(slot.chain, tight=tight) <= slot.budget:
            break
        if grid >= last:  # rounding up loses the budget at every grid: the relaxation
            # at the first grid (the precision asked for) bounds and guides
            return _discretized(chain, budget, capped, min(slots, last), limit, tight, options)
        grid = min(2 * grid, last)
    table = build_table(slot.chain, slot.budget, tight=tight, progress=progress)
    rounded = table.ops(slot.budget), table.value(slot.budget)
    del table  # before the relaxation's table: one table in memory at a time
    return _discretized(chain, budget, capped, grid, limit, tight, options, rounded)


@register(
    "rotor",
    problem=Chain,
    exact=True,
    description="optimal persistent schedule: rotor's dynamic program (Beaumont et al. 2019)",
)
def rotor(
    chain: Chain,
    budget: int,
    *,
    model: str = "tight",
    max_slots: int = 10_000,
    slots: int = 500,
    lower_bound: bool = True,
    memory_cap: int | None = None,
    progress=None,
) -> Schedule:
    """Optimal persistent schedule of ``chain`` under ``budget`` bytes.

    ``model="tight"`` (default) is the exact optimum over persistent schedules for the
    simulator's semantics (docs/semantics.md; checked against brute force), monotone
    in the budget. ``model="published"`` runs rotor's recursion as published, so
    values and infeasibility match rotor's; it charges F_all(i) with d_{i+1} instead of
    the d_{t+1} really resident, so its schedule may exceed the budget in simulation
    (then the tight model's schedule is returned, ``meta["published_value"]`` keeps
    rotor's number) or miss one that fits.

    Exact (``meta["exact"]``) while the budget, capped at the store-all peak and
    counted in units of the sizes' gcd, is at most ``max_slots`` units and the table
    fits ``memory_cap`` bytes (default: a quarter of the RAM; ``meta["memory_cap"]``).
    Beyond, sizes are rounded up to ``slots`` slots (refined x2 up to ``max_slots`` or
    the cap when rounding makes the budget infeasible, then a least-memory schedule,
    ``meta["fallback"]``) and ``meta["discretization"]`` reports the slot size, the
    makespan, a lower bound on the optimum and the relative loss.
    """
    if model not in MODELS:
        raise ValueError(f"rotor: model = {model!r}, expected one of {', '.join(MODELS)}")
    for name, value in (("max_slots", max_slots), ("slots", slots)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rotor: {name} = {value!r}, expected a positive int")
    if memory_cap is None:
        memory_cap = default_memory_cap()
    elif isinstance(memory_cap, bool) or not isinstance(memory_cap, int) or memory_cap < 1:
        raise ValueError(f"rotor: memory_cap = {memory_cap!r}, expected bytes (a positive int)")
    options = (max_slots, slots, lower_bound, memory_cap, progress)
    ops, meta = _solve(chain, budget, model == "tight", options)
    meta.update(model=model, memory_cap=memory_cap)
    if model == "published" and simulate_chain(chain, ops).peak_memory > budget:
        published = meta["dp_value"]
        try:
            ops, meta = _solve(chain, budget, True, options)
        except Infeasible as err:
            raise Infeasible(
                "rotor",
                budget,
                None,
                f"rotor's published recursion finds {published} s here, but its schedule "
                f"needs more than the budget in simulation; model='tight' needs "
                f"{err.min_budget}",
            ) from None
        meta.update(model="tight", published_value=published, memory_cap=memory_cap)
        meta["note"] = "rotor's published recursion under-counts F_all memory on this chain"
    return Schedule(ops, meta)
