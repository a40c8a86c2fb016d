"""The memory/time trade-off curve of a problem: makespan for many budgets at once."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from schedir import Chain, discretize, simulate_chain
from solvers.chain.rotor import (
    MODELS,
    build_table,
    default_memory_cap,
    min_memory,
    no_recompute_budget,
    plan_grid,
)
from solvers.registry import Infeasible, check_budget, get, solve, stderr_progress


@dataclass(frozen=True)
class Tradeoff:
    """Makespans of one method over budgets.

    Attributes:
        method: solver name.
        budgets: budgets, bytes (ascending).
        makespans: seconds; ``inf`` where the method has no schedule.
        solve_time: seconds for the whole curve.
        slot_size: bytes per slot when a rotor table was discretized, else None.
        exact: per budget, whether the makespan is an optimum of the method's model on
            the sizes as given (``solvers.solve`` at that budget finds the same value).
        lower_bounds: per budget, a lower bound on that optimum, seconds (equal to the
            makespan where exact; inf where no schedule exists).
    """

    method: str
    budgets: tuple[int, ...]
    makespans: tuple[float, ...]
    solve_time: float
    slot_size: int | None = None
    exact: tuple[bool, ...] = ()
    lower_bounds: tuple[float, ...] = ()


def _trivial_bound(problem) -> float:
    """A lower bound on any schedule's makespan without solving: no recomputation."""
    return problem.store_all_time() if isinstance(problem, Chain) else 0.0


def _answer(problem, budget: int, method: str = "rotor", **options) -> tuple[float, bool, float]:
    """(makespan, exact, lower bound) of ``solvers.solve`` at one budget."""
    try:
        meta = solve(problem, budget, method, **options).meta
    except Infeasible:
        exact = get(method, problem).exact
        return math.inf, exact, math.inf if exact else _trivial_bound(problem)
    value = meta["makespan"]
    if meta.get("exact"):
        return value, True, value
    bound = meta.get("lower_bound")
    return value, False, _trivial_bound(problem) if bound is None else bound


def tradeoff(
    chain,
    budgets: Sequence[int],
    method: str = "rotor",
    *,
    model: str = "tight",
    max_slots: int = 10_000,
    slots: int = 500,
    memory_cap: int | None = None,
    progress=False,
    **options,
) -> Tradeoff:
    """Makespan of ``method`` at every budget in ``budgets``, each with its exactness.

    For ``"rotor"`` on a chain, one DP table answers many budgets: budgets that
    ``solvers.solve`` would answer exactly (at most ``max_slots`` units of the sizes'
    gcd, the table within ``memory_cap``) share one exact table; the others share one
    table discretized for the largest of them (``slot_size``), whose values are
    feasible in bytes but may be above ``solve``'s at that budget: ``exact`` is then
    False and ``lower_bounds`` holds the same DP on sizes rounded down. A budget that
    rounding makes infeasible is solved on its own. Other methods are solved budget by
    budget.

    >>> import schedir
    >>> curve = tradeoff(schedir.load("examples/chain_small.json"), [1000, 1200, 2000])
    >>> curve.makespans, curve.exact
    ((inf, 26.0, 22.0), (True, True, True))
    """
    budgets = tuple(sorted(check_budget(b) for b in budgets))
    if not budgets:
        raise ValueError("tradeoff: budgets is empty")
    start = time.perf_counter()
    if method != "rotor" or not isinstance(chain, Chain):
        answers = [_answer(chain, b, method, progress=progress, **options) for b in budgets]
        return _curve(method, budgets, answers, start)
    if options:
        raise TypeError(f"tradeoff: unexpected options for rotor: {', '.join(options)}")
    if model not in MODELS:
        raise ValueError(f"rotor: model = {model!r}, expected one of {', '.join(MODELS)}")
    solo = {"model": model, "max_slots": max_slots, "slots": slots, "memory_cap": memory_cap}
    report = stderr_progress("tradeoff") if progress is True else progress or None
    answers, slot = _rotor_curve(chain, budgets, model == "tight", solo, report)
    return _curve(method, budgets, answers, start, slot)


def _curve(method, budgets, answers, start, slot=None) -> Tradeoff:
    values, exact, bounds = zip(*answers, strict=True)
    return Tradeoff(method, budgets, values, time.perf_counter() - start, slot, exact, bounds)


def _rotor_curve(chain: Chain, budgets, tight: bool, solo: dict, progress) -> tuple[list, int]:
    """[(makespan, exact, lower bound)] per budget, and the slot size (None if exact)."""
    least = min_memory(chain, tight=tight)
    top = no_recompute_budget(chain, tight=tight)
    cap = solo["memory_cap"] or default_memory_cap()
    answers: dict[int, tuple] = {}
    for b in budgets:
        if b < least:  # the model's least budget is exact in bytes
            answers[b] = (math.inf, True, math.inf)
        elif tight and b >= top:  # store-all fits
            answers[b] = (chain.store_all_time(), True, chain.store_all_time())
    rest = [b for b in budgets if b not in answers]

    def plan(b: int):
        kw = {"max_slots": solo["max_slots"], "slots": solo["slots"], "memory_cap": cap}
        return plan_grid(chain, min(b, top), **kw)

    exact_budgets = [b for b in rest if plan(b)[0] is not None]
    if exact_budgets:  # one exact table, in units of the sizes' gcd
        high = min(exact_budgets[-1], top)
        units = discretize(chain, high, slot_size=plan(high)[0])
        table = build_table(units.chain, units.budget, tight=tight, progress=progress)
        for b in exact_budgets:
            value = _published_fits(chain, table, min(b, top) // units.slot_size, b, tight)
            answers[b] = (value, True, value) if value is not None else _answer(chain, b, **solo)
        del table
    coarse = [b for b in rest if b not in answers]
    slot_size = None
    if coarse:  # one table in slots of the largest, and its relaxation for bounds
        high = min(coarse[-1], top)
        grid = plan(high)[1][0]
        up = discretize(chain, high, grid)
        slot_size = up.slot_size
        table = build_table(up.chain, up.budget, tight=tight, progress=progress)
        found = {b: _published_fits(chain, table, min(b, top) // slot_size, b, tight)
                 for b in coarse}  # fmt: skip
        del table
        down = discretize(chain, high, grid, round_up=False)
        relaxed = build_table(down.chain, down.budget, tight=tight, progress=progress)
        for b in coarse:
            value = found[b]
            if value is None or math.isinf(value):  # rounding lost the budget, or rotor's
                answers[b] = _answer(chain, b, **solo)  # schedule does not fit: on its own
                continue
            bound = relaxed.value(-(-min(b, top) // slot_size))
            answers[b] = (value, False, min(bound, value))
    return [answers[b] for b in budgets], slot_size


def _published_fits(chain, table, units: int, budget: int, tight: bool) -> float | None:
    """The table's value at ``units``; None for the published model where rotor's
    schedule exceeds ``budget`` in simulation (``solvers.solve`` then answers)."""
    value = table.value(units)
    if tight or math.isinf(value):
        return value
    return value if simulate_chain(chain, table.ops(units)).peak_memory <= budget else None
