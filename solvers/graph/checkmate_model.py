"""Checkmate's MILP of a graph as problem data (:class:`CheckmateModel`), and how a
solution is read back into ops (:func:`schedule_from_s`).

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

minimizing sum cost_i R[t,i]. The model is built as sparse matrices;
:mod:`solvers.graph.checkmate_milp` hands it to HiGHS (highspy),
:mod:`solvers.graph.checkmate_lp` solves its LP relaxation. A solution's S is turned
into ops by :func:`schedule_from_s` (the least recomputation given S, Checkmate's
"solve R given S"), which the simulator then judges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from schedir import Compute, Free, Graph, InvalidProblem


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
