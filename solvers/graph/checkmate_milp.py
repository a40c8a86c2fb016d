"""``checkmate_milp``: optimal rematerialization on graphs (Checkmate's MILP).

Jain, Jain, Paranjape, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez,
"Checkmate: Breaking the memory wall with optimal tensor rematerialization", MLSys 2020,
section 4 (frontier-advancing stages). Stage t computes the t-th non-input node
``C[t]`` (R[t, C[t]] = 1) and may recompute earlier nodes; binaries R[t,i] (compute i
in stage t), S[t,i] (i resident entering stage t), FREE[t,i,k] (free i after
computing k in stage t); continuous U[t,k] (bytes in use right after computing k in
stage t). Constraints (inputs of the graph: S[0,i] = 1, never computed)::

    R[t,k] <= R[t,i] + S[t,i]                  for each edge i -> k
    S[t+1,i] <= S[t,i] + R[t,i]                (S after the last stage is 0)
    U[t,C0] = sum_i size_i S[t,i] + size_C0 R[t,C0]
    U[t,k]  = U[t,k-1] - sum_{i in in(k-1) + {k-1}} size_i FREE[t,i,k-1] + size_k R[t,k]
    U[t,k] + tmp_k R[t,k] <= budget
    hazards(t,i,k) = (1 - R[t,k]) + S[t+1,i] + sum_{j user of i, k < j <= C[t]} R[t,j]
    1 - FREE[t,i,k] <= hazards(t,i,k) <= kappa (1 - FREE[t,i,k])

minimizing sum cost_i R[t,i]. The model is built as sparse matrices and handed to
HiGHS (highspy); :mod:`solvers.checkmate_lp` solves its LP relaxation. A solution's S
is turned into ops by :func:`schedule_from_s` (the least recomputation given S,
Checkmate's "solve R given S"), which the simulator then judges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from schedir import Compute, Free, Graph, GraphSchedule, InvalidProblem, simulate_graph
from solvers._highs import highs_lp, quiet_highs, run
from solvers.registry import Infeasible, register

SOLVER = "HIGHS"


@dataclass(frozen=True)
class CheckmateModel:
    """The MILP of a graph as sparse data: ``A_ub x + G_ub u <= b_ub`` (b_ub holds the
    budget in rows ``budget_rows``), ``A_eq x + G_eq u == b_eq``, x in {0,1}^nx, u >= 0.

    Attributes:
        graph: the graph.
        stages: ``stages[t]`` = C[t], the node stage t must compute.
        r_index: (t, i) -> column of R[t,i] in x; ``s_index``: (t, i) -> column of S[t,i].
        cost: objective coefficients (seconds) over x.
        unit: bytes per memory unit of the rows (U, sizes, tmp, budget): the greatest
            common divisor of the sizes and temporaries, so the rows are exact and small.
    """

    graph: Graph
    stages: tuple[int, ...]
    r_index: dict
    s_index: dict
    nx: int
    nu: int
    cost: np.ndarray
    A_ub: sp.csr_matrix
    G_ub: sp.csr_matrix
    b_ub: np.ndarray
    budget_rows: np.ndarray
    A_eq: sp.csr_matrix
    G_eq: sp.csr_matrix
    b_eq: np.ndarray
    unit: int = 1

    def b_ub_at(self, budget: float) -> np.ndarray:
        """The right-hand sides at ``budget`` bytes: in memory units, rounded down for an
        integer budget (exact: every memory row is a whole number of units)."""
        b = self.b_ub.copy()
        b[self.budget_rows] = budget // self.unit if isinstance(budget, int) else budget / self.unit
        return b


def build_model(graph: Graph) -> CheckmateModel:
    """Checkmate's frontier-advancing MILP of ``graph`` (budget left symbolic).

    Raises InvalidProblem when the memory rows, in units of the sizes' greatest common
    divisor, exceed 2**53 (HiGHS's doubles would round them)."""
    unit = math.gcd(*(n.size for n in graph.nodes), *(n.tmp for n in graph.nodes)) or 1
    top = budget_cap(graph) // unit
    if top > 2**53:
        raise InvalidProblem(
            f"checkmate_milp: sizes of up to {max(n.size for n in graph.nodes)} bytes give "
            f"memory rows of {top} units of {unit} bytes, beyond 2**53: HiGHS's doubles "
            f"cannot hold them exactly"
        )
    nodes = [replace(n, size=n.size // unit, tmp=n.tmp // unit) for n in graph.nodes]
    C = graph.computed
    T = len(C)
    pos = {i: t for t, i in enumerate(C)}
    is_input = [n.kind == "input" for n in nodes]
    cols: dict = {}

    def col(key) -> int:
        if key not in cols:
            cols[key] = len(cols)
        return cols[key]

    for t in range(T):
        for i in C[: t + 1]:
            col(("R", t, i))
        for i in graph.inputs:
            col(("S", t, i))
        for i in C[:t]:
            col(("S", t, i))

    def S(t: int, i: int):
        return cols.get(("S", t, i)) if t < T else None

    ub_rows, eq_rows = [], []  # each: (dict col->coef, dict ucol->coef, rhs)
    budget_rows = []
    ucols: dict = {}
    for t in range(T):
        for k in C[: t + 1]:
            ucols[t, k] = len(ucols)
    for t in range(T):
        eq_rows.append(({cols["R", t, C[t]]: 1.0}, {}, 1.0))
        if t == 0:
            for i in graph.inputs:
                eq_rows.append(({cols["S", 0, i]: 1.0}, {}, 1.0))
        for k in C[: t + 1]:
            for i in nodes[k].inputs:  # dependencies
                row = {cols["R", t, k]: 1.0, cols["S", t, i]: -1.0}
                if not is_input[i]:
                    row[cols["R", t, i]] = row.get(cols["R", t, i], 0.0) - 1.0
                ub_rows.append((row, {}, 0.0))
        if t + 1 < T:  # S[t+1] <= S[t] + R[t]
            for i in list(graph.inputs) + list(C[: t + 1]):
                row = {cols["S", t + 1, i]: 1.0}
                if ("S", t, i) in cols:
                    row[cols["S", t, i]] = -1.0
                if ("R", t, i) in cols:
                    row[cols["R", t, i]] = -1.0
                ub_rows.append((row, {}, 0.0))
        # memory
        prev = None
        for k in C[: t + 1]:
            urow = {ucols[t, k]: 1.0}
            xrow = {cols["R", t, k]: -float(nodes[k].size)}
            if prev is None:
                for i in list(graph.inputs) + list(C[:t]):
                    xrow[cols["S", t, i]] = xrow.get(cols["S", t, i], 0.0) - nodes[i].size
            else:
                urow[ucols[t, prev]] = -1.0
                for i in (*nodes[prev].inputs, prev):
                    key = ("FREE", t, i, prev)
                    xrow[col(key)] = float(nodes[i].size)
            eq_rows.append((xrow, urow, 0.0))
            budget_rows.append(len(ub_rows))
            ub_rows.append(({cols["R", t, k]: float(nodes[k].tmp)}, {ucols[t, k]: 1.0}, 0.0))
            prev = k
        # FREE[t,i,k] linearization; FREE of the last computed node is never needed
        for k in C[: t + 1]:
            for i in (*nodes[k].inputs, k):
                key = ("FREE", t, i, k)
                if key not in cols:
                    continue
                later = [j for j in graph.users[i] if pos[k] < pos[j] <= t]
                hz = {cols["R", t, k]: -1.0}
                const = 1.0
                if S(t + 1, i) is not None:
                    hz[S(t + 1, i)] = hz.get(S(t + 1, i), 0.0) + 1.0
                for j in later:
                    hz[cols["R", t, j]] = hz.get(cols["R", t, j], 0.0) + 1.0
                kappa = 2.0 + len(later)
                f = cols[key]
                # 1 - FREE <= const + hz.x   ->  -FREE - hz.x <= const - 1
                row = {c: -v for c, v in hz.items()}
                row[f] = row.get(f, 0.0) - 1.0
                ub_rows.append((row, {}, const - 1.0))
                # const + hz.x <= kappa (1 - FREE)  ->  hz.x + kappa FREE <= kappa - const
                row = dict(hz)
                row[f] = row.get(f, 0.0) + kappa
                ub_rows.append((row, {}, kappa - const))

    nx, nu = len(cols), len(ucols)

    def mats(rows):
        xi, xj, xv, ui, uj, uv, rhs = [], [], [], [], [], [], []
        for r, (xr, ur, b) in enumerate(rows):
            for c, v in xr.items():
                xi.append(r), xj.append(c), xv.append(v)
            for c, v in ur.items():
                ui.append(r), uj.append(c), uv.append(v)
            rhs.append(b)
        m = len(rows)
        return (
            sp.csr_matrix((xv, (xi, xj)), shape=(m, nx)),
            sp.csr_matrix((uv, (ui, uj)), shape=(m, nu)),
            np.asarray(rhs, dtype=float),
        )

    A_ub, G_ub, b_ub = mats(ub_rows)
    A_eq, G_eq, b_eq = mats(eq_rows)
    cost = np.zeros(nx)
    for (kind, *rest), c in cols.items():
        if kind == "R":
            cost[c] = nodes[rest[1]].cost
    return CheckmateModel(
        graph, tuple(C), {(t, i): c for (kd, t, i, *_), c in cols.items() if kd == "R"},
        {(t, i): c for (kd, t, i, *_), c in cols.items() if kd == "S"},
        nx, nu, cost, A_ub, G_ub, b_ub, np.asarray(budget_rows, dtype=int), A_eq, G_eq, b_eq,
        unit,
    )  # fmt: skip


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


def budget_cap(graph: Graph) -> int:
    """A budget (bytes) that no memory row of the model can reach: every output counted
    twice (computed while resident) plus the largest temporary. Budgets above it are
    the same problem, so solvers cap there before converting to float."""
    return 2 * sum(n.size for n in graph.nodes) + max(n.tmp for n in graph.nodes)


def s_matrix(model: CheckmateModel, xvalue: np.ndarray) -> np.ndarray:
    """The (T, n) matrix of S values of a solution (0 where S is not a variable)."""
    S = np.zeros((len(model.stages), len(model.graph)))
    for (t, i), c in model.s_index.items():
        S[t, i] = xvalue[c]
    return S


def schedule_from_s(graph: Graph, keep: np.ndarray) -> tuple:
    """Graph ops from a 0/1 matrix ``keep[t, i]`` (keep i resident entering stage t).

    Follows Checkmate's two-phase rounding: walking the stages backwards, stage t
    computes C[t] and, in topological order, the least set of nodes needed by what it
    computes and by the nodes kept into stage t+1 that ``keep[t]`` lacks; ``keep[t]`` is
    pruned to the nodes actually used (an input node stays resident until its last
    use). Outputs are freed right after their last use in a stage unless kept.
    """
    nodes = graph.nodes
    C = graph.computed
    T = len(C)
    inputs = set(graph.inputs)
    compute = [set() for _ in range(T)]
    kept = [set() for _ in range(T + 1)]
    for t in range(T - 1, -1, -1):
        have = {i for i in C[:t] if keep[t, i] > 0.5} | inputs
        todo = {C[t]} | {i for i in kept[t + 1] if i not in have}
        for i in sorted(todo | set(C[: t + 1]), reverse=True):
            if i in todo and i not in have:
                compute[t].add(i)
                todo.update(j for j in nodes[i].inputs if j not in have)
        used = set(kept[t + 1]) - compute[t]
        for i in compute[t]:
            used.update(nodes[i].inputs)
        kept[t] = {i for i in used if i in have}
    ops: list = []
    resident = set(inputs)
    for t in range(T):
        order = sorted(compute[t])
        uses: dict[int, int] = {}
        for k in order:
            for j in nodes[k].inputs:
                uses[j] = uses.get(j, 0) + 1
        nxt = kept[t + 1]
        for i in sorted(resident):
            if i not in nxt and uses.get(i, 0) == 0:
                ops.append(Free(i))
                resident.discard(i)
        for k in order:
            ops.append(Compute(k))
            resident.add(k)
            for j in (*nodes[k].inputs, k):
                if j != k:
                    uses[j] -= 1
                if j in resident and j not in nxt and uses.get(j, 0) == 0:
                    ops.append(Free(j))
                    resident.discard(j)
    return tuple(ops)


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
