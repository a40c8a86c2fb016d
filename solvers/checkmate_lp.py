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
from solvers.checkmate_milp import SOLVER, build_model, s_matrix, schedule_from_s, solve_model
from solvers.registry import Infeasible, register


def lp_bound(graph: Graph, budget: int, time_limit: float | None = None) -> float | None:
    """The LP relaxation's optimum at ``budget`` (seconds); None if the LP is infeasible."""
    return solve_model(build_model(graph), budget, integer=False, time_limit=time_limit).objective


@register(
    "checkmate_lp",
    problem=Graph,
    exact=False,
    description="Checkmate's LP relaxation (cvxpy + HiGHS) with threshold and randomized rounding",
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

    Raises :class:`Infeasible` when no rounding fits: ``min_budget`` is None (rounding
    is not monotone in the budget) and the message gives the least peak seen.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction = {fraction!r}: expected 0 < fraction <= 1")
    model = build_model(graph)
    full = solve_model(model, budget, integer=False, time_limit=time_limit)
    if full.x is None:
        raise Infeasible(
            "checkmate_lp", budget, None, f"the LP relaxation is {full.status} at this budget"
        )
    sources = [("full", full)]
    if fraction < 1:
        scaled = solve_model(model, fraction * budget, integer=False, time_limit=time_limit)
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
            f"none of {tried} roundings fits; least peak {least_peak}, LP bound {full.objective}",
        )
    return GraphSchedule(
        best[1],
        {
            "solver": f"cvxpy / {SOLVER} (LP)",
            "lp_bound": full.objective,
            "fraction": fraction,
            "rounding": best[2],
            "roundings_tried": tried,
            "lp_time": sum(s.time for _, s in sources),
        },
    )
