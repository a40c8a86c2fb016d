"""``checkmate_milp``: optimal rematerialization on graphs (Checkmate's MILP).

Jain, Jain, Paranjape, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez,
"Checkmate: Breaking the memory wall with optimal tensor rematerialization", MLSys 2020,
section 4. The model (its variables and constraints) is
:mod:`solvers.graph.checkmate_model`'s; here HiGHS (highspy) solves it
(:func:`solve_model`), finds the least budget it has a solution at
(:func:`least_budget`), and :func:`checkmate_milp` turns the optimum into ops that the
simulator then judges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from schedir import Graph, GraphSchedule, simulate_graph
from solvers._highs import highs_lp, quiet_highs, run
from solvers.graph.checkmate_model import (
    CheckmateModel,
    budget_cap,
    build_model,
    s_matrix,
    schedule_from_s,
)
from solvers.registry import Infeasible, register

SOLVER = "HIGHS"


@dataclass(frozen=True)
class Solved:
    """One HiGHS solve of the model.

    Attributes:
        status: ``"optimal"``, ``"infeasible"``, ``"time_limit"`` or HiGHS's name of
            another model status.
        objective: seconds (bytes when minimizing the budget) of the solution, or None.
        x: the columns of the solution (the model's x, then u), or None.
        mip_gap, bound: HiGHS's relative gap and dual bound (a lower bound of the
            optimum, same unit as ``objective``), None when unknown.
        time: seconds HiGHS ran.
        presolve: whether HiGHS's presolve was on (it is turned off to confirm an
            infeasibility, see :func:`solve_confirmed`).
    """

    status: str
    objective: float | None
    x: np.ndarray | None
    mip_gap: float | None
    bound: float | None
    time: float
    presolve: bool = True

    @property
    def infeasible(self) -> bool:
        return self.x is None and self.status == "infeasible"

    @property
    def optimal(self) -> bool:
        return self.x is not None and self.status == "optimal"


def _status(model_status) -> str:
    import highspy

    names = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
        # the model is bounded (binaries, non-negative costs): never unbounded
        highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible",
        highspy.HighsModelStatus.kTimeLimit: "time_limit",
    }
    return names.get(model_status, str(model_status).rsplit(".", 1)[-1])


def solve_model(
    model: CheckmateModel,
    budget: float,
    *,
    integer: bool,
    time_limit: float | None = None,
    mip_rel_gap: float = 1e-6,
    minimize_budget: bool = False,
    presolve: bool = True,
    start: np.ndarray | None = None,
) -> Solved:
    """Solve the MILP (``integer``) or its LP relaxation at ``budget`` with HiGHS.

    ``minimize_budget`` instead minimizes the budget itself (for ``min_budget``; one
    more column, the budget, in the budget rows); ``presolve=False`` turns HiGHS's
    presolve off; ``time_limit`` is in seconds; ``start``: a solution's columns (x
    then u) to start from.
    """
    import highspy

    inf = highspy.kHighsInf
    nx, nu = model.nx, model.nu
    ub_rows = sp.hstack([model.A_ub, model.G_ub], format="csr")
    rhs = model.b_ub_at(float(budget))
    extra = 0
    if minimize_budget:
        sel = np.zeros((len(model.b_ub), 1))
        sel[model.budget_rows, 0] = -1.0
        ub_rows = sp.hstack([ub_rows, sp.csr_matrix(sel)], format="csr")
        rhs = model.b_ub.copy()
        rhs[model.budget_rows] = 0.0
        extra = 1
    eq_rows = sp.hstack([model.A_eq, model.G_eq, sp.csr_matrix((len(model.b_eq), extra))])
    a = sp.vstack([eq_rows, ub_rows], format="csc")
    a.eliminate_zeros()
    # Costs are seconds (often 1e-7..1e-5): scale them to O(1), else HiGHS's absolute
    # gap and feasibility tolerances (1e-6) swallow whole recomputations.
    scale = 1.0 if minimize_budget else float(np.abs(model.cost).sum()) or 1.0
    cost = np.zeros(nx + nu + extra)
    if minimize_budget:
        cost[-1] = 1.0
    else:
        cost[:nx] = model.cost / scale
    upper = np.concatenate([np.ones(nx), np.full(nu + extra, inf)])
    integral = [True] * nx + [False] * (nu + extra) if integer else None
    lp = highs_lp(cost, a, np.concatenate([model.b_eq, np.full(len(rhs), -inf)]),
                  np.concatenate([model.b_eq, rhs]), np.zeros(nx + nu + extra), upper,
                  integral)  # fmt: skip
    h = quiet_highs()
    h.setOptionValue("presolve", "on" if presolve else "off")
    if time_limit is not None:
        h.setOptionValue("time_limit", max(float(time_limit), 1e-3))
    if integer:
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start[: nx + nu]) + [0.0] * extra
        sol.value_valid = True
        h.setSolution(sol)
    run(h)
    status = _status(h.getModelStatus())
    info = h.getInfo()
    has = info.primal_solution_status == 2 and status in ("optimal", "time_limit")
    gap = bound = None
    if integer:
        gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else None
        if math.isfinite(info.mip_dual_bound):
            bound = float(info.mip_dual_bound) * scale
    elif status == "optimal":
        bound = float(info.objective_function_value) * scale
    x = np.asarray(h.getSolution().col_value[: nx + nu], dtype=float) if has else None
    return Solved(
        status=status,
        objective=float(info.objective_function_value) * scale if has else None,
        x=x,
        mip_gap=gap,
        bound=bound,
        time=float(h.getRunTime()),
        presolve=presolve,
    )


class Deadline:
    """The time left of a ``time_limit`` (seconds; None: no limit) shared by several solves."""

    def __init__(self, time_limit: float | None) -> None:
        self.end = None if time_limit is None else time.perf_counter() + float(time_limit)

    def left(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.perf_counter())

    def passed(self) -> bool:
        return self.end is not None and time.perf_counter() >= self.end


@dataclass(frozen=True)
class LeastBudget:
    """The least budget of the model (bytes) when proven (``value``), else the bounds
    known (``lower``, ``upper``; None when unknown), and a solution at ``upper``."""

    value: int | None
    lower: int | None
    upper: int | None
    solution: np.ndarray | None = None


_LEAST: dict[Graph, LeastBudget] = {}  # proven least budgets, by graph


def least_budget(model: CheckmateModel, deadline: Deadline) -> LeastBudget:
    """The least budget at which the MILP has a solution: the optimum of the MILP that
    minimizes the budget, solved *without* HiGHS's presolve (which has declared
    feasible instances infeasible); under a time limit, the bounds known. Proven
    values are remembered per graph."""
    if model.graph in _LEAST:
        return _LEAST[model.graph]
    res = solve_model(model, 0, integer=True, time_limit=deadline.left(),
                      minimize_budget=True, presolve=False)  # fmt: skip
    lower = None if res.bound is None else max(0, math.ceil(res.bound - 1e-6))
    if res.x is None:
        return LeastBudget(None, lower, None)
    upper = math.ceil(res.objective - 1e-6) * model.unit
    lower = upper if lower is None else min(lower * model.unit, upper)
    least = LeastBudget(upper if res.optimal else None, lower, upper, res.x)
    if res.optimal:
        _LEAST[model.graph] = least
    return least


@register(
    "checkmate_milp",
    problem=Graph,
    exact=True,
    description="Checkmate's frontier-advancing MILP (Jain et al. 2020), HiGHS",
)
def checkmate_milp(
    graph: Graph,
    budget: int,
    *,
    time_limit: float | None = 60.0,
    mip_rel_gap: float = 1e-6,
    progress: Callable[[float, str], None] | None = None,
) -> GraphSchedule:
    """The optimal schedule of Checkmate's model under ``budget`` bytes.

    ``time_limit`` (seconds, None: none) bounds the whole call, every HiGHS solve
    included. When it stops HiGHS, the best incumbent is returned with
    ``meta["exact"] = False``, ``meta["time_limited"] = True`` and
    ``meta["lower_bound"]`` (seconds, HiGHS's dual bound). ``progress(fraction,
    message)``, if given, hears of each HiGHS solve. HiGHS's presolve has
    declared feasible instances infeasible, so its "infeasible" is believed only when
    the least budget of the model, found by a MILP minimizing the budget solved
    without presolve (:func:`least_budget`), is above ``budget``; otherwise the
    budget is solved again without presolve, from that solution.

    Raises :class:`Infeasible`: with ``min_budget`` = the least budget of the model
    when it is proven; else with ``min_budget`` None and what is known of it in the
    message and in the attributes ``least_budget_lower`` and ``least_budget_upper``
    (bytes, or None), e.g. when the time limit stops the search or no schedule was
    found in time.
    """
    deadline = Deadline(time_limit)
    model = build_model(graph)

    def say(message: str) -> None:  # one line per HiGHS solve: each may take a while
        if progress is not None:
            done = 0.0 if time_limit is None else 1 - (deadline.left() or 0) / time_limit
            progress(min(1.0, done), message)

    say(f"MILP: {model.nx} binaries, {model.A_ub.shape[0] + model.A_eq.shape[0]} rows")
    capped = min(budget, budget_cap(graph))  # the same problem, and a float
    res = solve_model(model, capped, integer=True, time_limit=deadline.left(),
                      mip_rel_gap=mip_rel_gap)  # fmt: skip
    if res.x is None:
        say(f"HiGHS: {res.status}; the least budget, without presolve")
        limit = f"time_limit={time_limit}s"
        if not res.infeasible:
            raise _infeasible(
                budget,
                LeastBudget(None, None, None),
                f"no schedule found within {limit}; the budget may be feasible",
            )
        # HiGHS's "infeasible" is believed only if the least budget, found without
        # presolve, is above the budget.
        least = least_budget(model, deadline)
        if least.upper is not None and least.upper <= budget:
            say("presolve was wrong: solving again without it")
            res = solve_model(model, capped, integer=True, time_limit=deadline.left(),
                              mip_rel_gap=mip_rel_gap, presolve=False,
                              start=least.solution)  # fmt: skip
            if res.x is None:  # out of time: the least-budget solution fits
                x = least.solution
                res = Solved("time_limit", float(model.cost @ x[: model.nx]), x, None, None,
                             res.time, presolve=False)  # fmt: skip
        elif least.value is not None:
            raise _infeasible(budget, least, "the least budget of Checkmate's model")
        elif least.lower is not None and least.lower > budget:
            raise _infeasible(budget, least, f"{limit} reached before the least budget "
                              "was proven")  # fmt: skip
        else:
            raise _infeasible(budget, least, f"no schedule found within {limit} (HiGHS with "
                              "presolve says infeasible, not confirmed in time)")  # fmt: skip
    ops = schedule_from_s(graph, s_matrix(model, res.x))
    trace = simulate_graph(graph, ops)
    if trace.peak_memory > budget:  # pragma: no cover - extraction never exceeds U
        raise RuntimeError(f"checkmate_milp: extracted peak {trace.peak_memory} > {budget}")
    meta = {
        "exact": res.optimal,
        "solver": _solver_name(),
        "milp_objective": res.objective,
        "mip_gap": res.mip_gap,
        "mip_bound": res.bound,
        "optimal": res.optimal,
        "status": res.status,
        "presolve": res.presolve,
        "milp_time": res.time,
        "variables": {"binary": model.nx, "continuous": model.nu},
        "constraints": model.A_ub.shape[0] + model.A_eq.shape[0],
    }
    if not res.optimal:
        meta["time_limited"] = True
        if res.bound is not None:
            meta["lower_bound"] = res.bound
    return GraphSchedule(ops, meta)


def _solver_name() -> str:
    from importlib.metadata import version

    return f"{SOLVER} (highspy {version('highspy')})"


def _infeasible(budget: int, least: LeastBudget, detail: str) -> Infeasible:
    """Infeasible with ``min_budget`` only when proven; the bounds as attributes (and in
    the message) otherwise."""
    if least.value is None and (least.lower is not None or least.upper is not None):
        lo = "?" if least.lower is None else least.lower
        hi = "?" if least.upper is None else least.upper
        detail += f"; the least budget of the model is in [{lo}, {hi}]"
    err = Infeasible("checkmate_milp", budget, least.value, detail)
    err.least_budget_lower, err.least_budget_upper = least.lower, least.upper
    return err
