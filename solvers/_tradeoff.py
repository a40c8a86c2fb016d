"""The memory/time trade-off curve of a chain: makespan for many budgets at once."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from schedir import Chain, discretize
from solvers.registry import Infeasible, check_budget, solve
from solvers.rotor import build_table, no_recompute_budget


@dataclass(frozen=True)
class Tradeoff:
    """Makespans of one method over budgets.

    Attributes:
        method: solver name.
        budgets: budgets, bytes (ascending).
        makespans: seconds; ``inf`` where the method has no schedule.
        solve_time: seconds for the whole curve.
        slot_size: bytes per slot when the rotor table was discretized, else None.
    """

    method: str
    budgets: tuple[int, ...]
    makespans: tuple[float, ...]
    solve_time: float
    slot_size: int | None = None


def tradeoff(
    chain: Chain,
    budgets: Sequence[int],
    method: str = "rotor",
    *,
    model: str = "published",
    max_slots: int = 10_000,
    slots: int = 500,
    **options,
) -> Tradeoff:
    """Makespan of ``method`` at every budget in ``budgets``.

    For ``"rotor"`` one DP table, built for the largest budget, answers all of them
    (``model`` as in ``solvers.solve(..., method="rotor")``); beyond ``max_slots`` the
    table is in slots of the largest budget and every value is feasible in bytes.
    Other methods are solved budget by budget.

    >>> import schedir
    >>> curve = tradeoff(schedir.load("examples/chain_small.json"), [1000, 1200, 2000])
    >>> curve.makespans
    (inf, 26.0, 22.0)
    """
    budgets = tuple(sorted(check_budget(b) for b in budgets))
    if not budgets:
        raise ValueError("tradeoff: budgets is empty")
    start = time.perf_counter()
    if method != "rotor":
        values = []
        for b in budgets:
            try:
                values.append(solve(chain, b, method, **options).meta["makespan"])
            except Infeasible:
                values.append(math.inf)
        return Tradeoff(method, budgets, tuple(values), time.perf_counter() - start)
    if options:
        raise TypeError(f"tradeoff: unexpected options for rotor: {', '.join(options)}")
    tight = model == "tight"
    top = min(budgets[-1], no_recompute_budget(chain, tight=tight))
    if top < chain.in_size[0]:
        return Tradeoff(method, budgets, (math.inf,) * len(budgets), time.perf_counter() - start)
    if top <= max_slots:
        table = build_table(chain, top, tight=tight)
        values = tuple(table.value(min(b, top)) for b in budgets)
        return Tradeoff(method, budgets, values, time.perf_counter() - start)
    slot = discretize(chain, top, slots)
    table = (
        build_table(slot.chain, slot.budget, tight=tight)
        if slot.budget >= slot.chain.in_size[0]
        else None
    )
    values = tuple(
        table.value(min(b, top) // slot.slot_size) if table is not None else math.inf
        for b in budgets
    )
    return Tradeoff(method, budgets, values, time.perf_counter() - start, slot.slot_size)
