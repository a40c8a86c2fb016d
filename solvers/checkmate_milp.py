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
cvxpy (HiGHS); :mod:`solvers.checkmate_lp` solves its LP relaxation. A solution's S
is turned into ops by :func:`schedule_from_s` (the least recomputation given S,
Checkmate's "solve R given S"), which the simulator then judges.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from schedir import Compute, Free, Graph, GraphSchedule, simulate_graph
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

    def b_ub_at(self, budget: float) -> np.ndarray:
        b = self.b_ub.copy()
        b[self.budget_rows] = budget
        return b


def build_model(graph: Graph) -> CheckmateModel:
    """Checkmate's frontier-advancing MILP of ``graph`` (budget left symbolic)."""
    nodes = graph.nodes
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
    )  # fmt: skip


@dataclass(frozen=True)
class Solved:
    """A cvxpy solve of the model: status, objective (seconds), x, and HiGHS's info."""

    status: str
    objective: float | None
    x: np.ndarray | None
    mip_gap: float | None
    bound: float | None
    time: float


def solve_model(
    model: CheckmateModel,
    budget: float,
    *,
    integer: bool,
    time_limit: float | None = None,
    mip_rel_gap: float = 1e-6,
    minimize_budget: bool = False,
) -> Solved:
    """Solve the MILP (``integer``) or its LP relaxation at ``budget`` with HiGHS.

    ``minimize_budget`` instead minimizes the budget itself (for ``min_budget``).
    """
    if SOLVER not in cp.installed_solvers():  # pragma: no cover - highspy is a dependency
        raise RuntimeError("cvxpy cannot find HiGHS: install highspy")
    scale = 1.0 if minimize_budget else float(np.abs(model.cost).sum()) or 1.0
    x = cp.Variable(model.nx, boolean=True) if integer else cp.Variable(model.nx)
    u = cp.Variable(model.nu, nonneg=True)
    cons = [model.A_eq @ x + model.G_eq @ u == model.b_eq]
    if minimize_budget:
        m = cp.Variable(nonneg=True)
        sel = np.zeros(len(model.b_ub))
        sel[model.budget_rows] = 1.0
        cons.append(model.A_ub @ x + model.G_ub @ u <= model.b_ub + cp.multiply(sel, m))
        objective = cp.Minimize(m)
    else:
        cons.append(model.A_ub @ x + model.G_ub @ u <= model.b_ub_at(float(budget)))
        # Costs are seconds (often 1e-7..1e-5): scale them to O(1), else HiGHS's absolute
        # gap and feasibility tolerances (1e-6) swallow whole recomputations.
        objective = cp.Minimize((model.cost / scale) @ x)
    if not integer:
        cons += [x >= 0, x <= 1]
    prob = cp.Problem(objective, cons)
    opts: dict = {}
    if time_limit is not None:
        opts["time_limit"] = float(time_limit)
    if integer:
        opts["mip_rel_gap"] = float(mip_rel_gap)
    start = time.perf_counter()
    prob.solve(solver=cp.HIGHS, **opts)
    elapsed = time.perf_counter() - start
    info = prob.solver_stats.extra_stats if prob.solver_stats is not None else None
    gap = bound = None
    if integer and info is not None:
        gap = float(getattr(info, "mip_gap", math.nan))
        bound = float(getattr(info, "mip_dual_bound", math.nan)) * scale
    has = prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT) and x.value is not None
    if has and info is not None and integer and getattr(info, "primal_solution_status", 2) != 2:
        has = False
    return Solved(
        status=prob.status,
        objective=float(prob.value) * scale if has else None,
        x=np.asarray(x.value, dtype=float) if has else None,
        mip_gap=gap,
        bound=bound,
        time=elapsed,
    )


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
    description="Checkmate's frontier-advancing MILP (Jain et al. 2020), cvxpy + HiGHS",
)
def checkmate_milp(
    graph: Graph, budget: int, *, time_limit: float | None = 60.0, mip_rel_gap: float = 1e-6
) -> GraphSchedule:
    """The optimal schedule of Checkmate's model under ``budget`` bytes.

    ``time_limit`` (seconds, None: none) bounds HiGHS; then the best incumbent is
    returned and ``meta["mip_gap"]`` says how far from optimal it may be. Raises
    :class:`Infeasible` with ``min_budget`` = the least budget of the model (a second
    MILP minimizing the budget) when nothing fits.
    """
    model = build_model(graph)
    res = solve_model(model, budget, integer=True, time_limit=time_limit, mip_rel_gap=mip_rel_gap)
    if res.x is None:
        if res.status == cp.USER_LIMIT:
            raise Infeasible(
                "checkmate_milp", budget, None, f"no incumbent within time_limit={time_limit}s"
            )
        least = solve_model(
            model, budget, integer=True, time_limit=time_limit, minimize_budget=True
        )
        lo = None if least.objective is None else math.ceil(least.objective - 1e-6)
        raise Infeasible("checkmate_milp", budget, lo, f"HiGHS status {res.status}")
    ops = schedule_from_s(graph, s_matrix(model, res.x))
    trace = simulate_graph(graph, ops)
    if trace.peak_memory > budget:  # pragma: no cover - extraction never exceeds U
        raise RuntimeError(f"checkmate_milp: extracted peak {trace.peak_memory} > {budget}")
    return GraphSchedule(
        ops,
        {
            "solver": f"cvxpy {cp.__version__} / {SOLVER}",
            "milp_objective": res.objective,
            "mip_gap": res.mip_gap,
            "mip_bound": res.bound,
            "optimal": res.status == cp.OPTIMAL,
            "status": res.status,
            "milp_time": res.time,
            "variables": {"binary": model.nx, "continuous": model.nu},
            "constraints": model.A_ub.shape[0] + model.A_eq.shape[0],
        },
    )
