"""``checkmate_lp``: Checkmate's LP relaxation with two-phase rounding.

Jain et al., MLSys 2020, section 5: solve the LP relaxation of the MILP of
:mod:`solvers.checkmate_milp` (same model, integrality relaxed), round its S (which
outputs to keep between stages) and recompute the least R given S. The LP is solved at
a ``fraction`` of the budget so that rounded schedules, whose memory the LP does not
control, more often fit the full budget. Roundings: a deterministic threshold sweep
(S >= tau for several tau) and ``samples`` randomized roundings (S_ti ~ Bernoulli).
Every candidate is judged by the graph simulator at the full budget; the cheapest that
fits is returned. ``meta["lp_bound"]`` is the LP optimum *at the full budget*, a lower
bound of the MILP optimum (and of every frontier-advancing schedule) at that budget.
"""

from __future__ import annotations

import numpy as np

from schedir import Graph, GraphSchedule, InvalidSchedule, simulate_graph
from solvers.graph.checkmate_milp import SOLVER, Deadline, solve_model
from solvers.graph.checkmate_model import budget_cap, build_model, s_matrix, schedule_from_s
from solvers.registry import Infeasible, register


def lp_bound(graph: Graph, budget: int, time_limit: float | None = None) -> float | None:
    """The LP relaxation's optimum at ``budget`` (seconds); None if the LP is infeasible."""
    capped = min(budget, budget_cap(graph))
    return solve_model(build_model(graph), capped, integer=False, time_limit=time_limit).bound


@register(
    "checkmate_lp",
    problem=Graph,
    exact=False,
    description="Checkmate's LP relaxation (HiGHS) with threshold and randomized rounding",
)
def checkmate_lp(
    graph: Graph,
    budget: int,
    *,
    fraction: float = 0.9,
    thresholds: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99),
    samples: int = 20,
    seed: int = 0,
    time_limit: float | None = 60.0,
) -> GraphSchedule:
    """Round the LP relaxation (solved at ``fraction`` * ``budget`` and at ``budget``).

    ``time_limit`` (seconds) bounds both LP solves together; ``meta["lp_bound"]`` is
    None when the LP at the full budget was not solved to optimality (then
    ``meta["time_limited"]`` is True). Raises :class:`Infeasible` when no rounding
    fits: ``min_budget`` is None (rounding is not monotone in the budget, the least
    budget is not known) and the message gives the least peak seen.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction = {fraction!r}: expected 0 < fraction <= 1")
    deadline = Deadline(time_limit)
    model = build_model(graph)
    capped = min(budget, budget_cap(graph))  # the same problem, and a float
    full = solve_model(model, capped, integer=False, time_limit=deadline.left())
    if full.x is None:
        why = (
            f"the LP relaxation was not solved within time_limit={time_limit}s"
            if full.status == "time_limit"
            else f"the LP relaxation is {full.status} at this budget"
        )
        raise Infeasible("checkmate_lp", budget, None, why)
    sources = [("full", full)]
    if fraction < 1 and not deadline.passed():
        scaled = solve_model(model, fraction * capped, integer=False, time_limit=deadline.left())
        if scaled.x is not None:
            sources.insert(0, (f"x{fraction}", scaled))
    rng = np.random.default_rng(seed)
    best = None  # (makespan, ops, how)
    least_peak = None
    tried = 0
    seen: set[bytes] = set()
    for label, sol in sources:
        S = np.clip(s_matrix(model, sol.x), 0.0, 1.0)
        cands = [(f"{label} threshold {tau}", S >= tau) for tau in thresholds]
        cands += [(f"{label} random {r}", rng.random(S.shape) < S) for r in range(samples)]
        for how, keep in cands:
            key = np.packbits(keep).tobytes()
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            ops = schedule_from_s(graph, keep.astype(float))
            try:
                trace = simulate_graph(graph, ops)
            except InvalidSchedule:  # pragma: no cover - schedule_from_s is always valid
                continue
            if least_peak is None or trace.peak_memory < least_peak:
                least_peak = trace.peak_memory
            if trace.peak_memory <= budget and (best is None or trace.makespan < best[0]):
                best = (trace.makespan, ops, how)
    if best is None:
        raise Infeasible(
            "checkmate_lp",
            budget,
            None,
            f"none of {tried} roundings fits; least peak {least_peak}, LP bound {full.bound}",
        )
    meta = {
        "exact": False,
        "solver": f"{SOLVER} (LP)",
        "lp_bound": full.bound,
        "fraction": fraction,
        "rounding": best[2],
        "roundings_tried": tried,
        "lp_time": sum(s.time for _, s in sources),
    }
    if not full.optimal:
        meta["time_limited"] = True
    return GraphSchedule(best[1], meta)
