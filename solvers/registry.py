"""One registry for every solver: ``solve(problem, budget, method=...)`` and ``available()``.

A solver is a function ``(problem, budget, **options) -> Schedule`` registered under a
name with the problem kind it reads. :func:`solve` validates the budget, times the
solver, checks the result with the simulator (the judge) and fills the metadata, so
no solver special-cases any of that.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass

from schedir import InvalidProblem, InvalidSchedule, Schedule, simulate
from schedir.simulate import JUDGES, judge


class Infeasible(ValueError):
    """No schedule of this method fits the budget.

    Attributes:
        budget: the budget asked for, bytes.
        min_budget: the least budget for which the method returns a schedule, bytes
            (computed, not guessed; ``None`` when the method cannot tell).
    """

    def __init__(self, method: str, budget: int, min_budget: int | None, detail: str = ""):
        self.method, self.budget, self.min_budget = method, budget, min_budget
        least = f"the minimum feasible budget is {min_budget}" if min_budget is not None else ""
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{method}: no schedule fits budget {budget}; {least}{extra}")


@dataclass(frozen=True)
class Method:
    """A registered solver.

    Attributes:
        name: the registry key, e.g. ``"rotor"``.
        function: ``(problem, budget, **options) -> Schedule``.
        problem: the problem class it reads (``schedir.Chain``, ...).
        exact: whether it returns an optimum of its model.
        description: one line.
    """

    name: str
    function: Callable[..., Schedule]
    problem: type
    exact: bool
    description: str


# One name may serve several problem kinds (e.g. "store_all" on chains and graphs).
_METHODS: dict[tuple[str, type], Method] = {}


def register(name: str, *, problem: type, exact: bool, description: str):
    """Decorator adding a solver function to the registry under ``name`` for ``problem``."""

    def wrap(function: Callable[..., Schedule]) -> Callable[..., Schedule]:
        if (name, problem) in _METHODS:
            raise ValueError(f"solver {name!r} is registered twice for {problem.__name__}")
        _METHODS[name, problem] = Method(name, function, problem, exact, description)
        return function

    return wrap


def available(problem: object | type | None = None) -> list[Method]:
    """Registered methods, optionally only those that read ``problem`` (an instance or class).

    >>> import schedir, solvers
    >>> [m.name for m in solvers.available(schedir.Chain) if m.exact]
    ['rotor']
    """
    methods = list(_METHODS.values())
    if problem is None:
        return methods
    kind = problem if isinstance(problem, type) else type(problem)
    return [m for m in methods if issubclass(kind, m.problem)]


def get(method: str, problem: object | type) -> Method:
    """The method called ``method`` that reads ``problem``; clear errors otherwise."""
    kind = problem if isinstance(problem, type) else type(problem)
    names = sorted({name for name, _ in _METHODS})
    if method not in names:
        raise ValueError(f"unknown solver {method!r}; known: {', '.join(names)}")
    for entry in available(kind):
        if entry.name == method:
            return entry
    readers = [m.problem.__name__ for m in _METHODS.values() if m.name == method]
    raise TypeError(
        f"solver {method!r} reads a {' or '.join(readers)}, got {kind.__name__}; "
        f"methods for {kind.__name__}: {', '.join(m.name for m in available(kind))}"
    )


def fixed_schedule(method: str, problem, schedule: Schedule, budget: int) -> Schedule:
    """``schedule`` if its simulated peak fits ``budget``; else Infeasible at that peak.

    For methods whose schedule does not depend on the budget (store-all, ...): their
    peak is exactly their least budget.
    """
    peak = simulate(problem, schedule).peak_memory
    if peak > budget:
        raise Infeasible(method, budget, peak, "a fixed schedule: its peak is its least budget")
    return schedule


def check_budget(budget: object) -> int:
    """A budget is a non-negative whole number of bytes (or slots)."""
    if budget is None:
        raise InvalidProblem("budget = None: this problem needs a memory budget (bytes)")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise InvalidProblem(f"budget = {budget!r}: expected a number of bytes")
    if not math.isfinite(float(budget)) or float(budget) != int(budget) or budget < 0:
        raise InvalidProblem(f"budget = {budget!r}: expected a non-negative whole number of bytes")
    return int(budget)


def solve(problem, budget: int | None, method: str = "rotor", **options) -> Schedule:
    """Solve ``problem`` under ``budget`` bytes with the registered ``method``.

    The returned schedule is accepted by ``schedir.simulate`` and by the problem's
    judge (``schedir.simulate.judge``: peak <= budget by default; the devices' own
    capacities for pipeline problems, which take ``budget=None``). Its ``meta`` holds
    ``method``, ``budget``, ``solve_time`` (seconds), ``options`` and what the judge
    reports (simulated ``makespan`` and ``peak_memory``; period and latency for
    pipelines). A method whose answer is not a schedule (a steady-state LP) returns
    that answer unchecked. Raises :class:`Infeasible` (with ``min_budget``) when
    nothing fits.

    >>> import schedir, solvers
    >>> chain = schedir.load("examples/chain_small.json")
    >>> s = solvers.solve(chain, 2000, method="rotor")
    >>> s.meta["peak_memory"] <= 2000
    True
    """
    entry = get(method, problem)
    if budget is not None or type(problem) not in JUDGES:
        budget = check_budget(budget)
    start = time.perf_counter()
    schedule = entry.function(problem, budget, **options)
    solve_time = time.perf_counter() - start
    if not hasattr(schedule, "ops"):  # e.g. a steady-state LP's rates: nothing to simulate
        return schedule
    trace = simulate(problem, schedule)
    try:
        verdict = judge(problem, trace, budget)
    except InvalidSchedule as err:  # a solver bug: never hand out a rejected schedule
        raise RuntimeError(f"{method} returned a schedule the simulator rejects: {err}") from None
    meta = {
        "method": method,
        "budget": budget,
        "solve_time": solve_time,
        "options": options,
        **schedule.meta,
        **verdict,
    }
    return type(schedule)(schedule.ops, meta)
