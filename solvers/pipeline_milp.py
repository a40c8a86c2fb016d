"""MILP for interval mapping with replication on heterogeneous devices (``"pipeline_milp"``).

Binary variables, for every candidate interval I = [i, j), device u, count r:
``y[I]`` (I is one of the intervals), ``x[I, u]`` (u runs a replica of I),
``z[I, r]`` (I has r replicas), and for every boundary k and count a,
``end[k, u, a]`` / ``start[k, u, a]`` (u runs the interval ending / starting at k,
which has a replicas). With T the period:

- the chosen intervals form a path 0 -> L: sum_{I from 0} y = 1, flow conservation
  at every boundary, sum_{I to L} y = 1;
- every device runs at most one interval; x[I, u] <= y[I]; sum_r z[I, r] = y[I];
  sum_u x[I, u] = sum_r r z[I, r]; x[I, u] = 0 when I does not fit u's memory;
- compute: T >= W(I) / (r speed_u) (x[I, u] + z[I, r] - 1);
- links: end[k, u, a] >= sum_{I to k} (x[I, u] + z[I, a]) - 1, likewise start; then
  T >= t_uv(x_k) / lcm(a, b) (end[k, u, a] + start[k, v, b] - 1), and u, v may not face
  each other across k when there is no link u -> v.

The link term charges every pair of replicas (``pairs="all"`` in
``schedir.pipeline.evaluate``), an order-free bound that equals the exact round-robin
term when gcd(a, b) = 1 or the links are identical; the reported ``period`` is the exact
one of the returned order (never larger). Minimizing T gives the optimum of this model,
checked against exhaustive search in the tests. HiGHS through cvxpy.
"""

from __future__ import annotations

import itertools
import math
import time

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from schedir.pipeline import Interval, Mapping, PipelineProblem, interval_memory, link_time
from solvers.pipeline_dp import mapping_schedule
from solvers.registry import Infeasible, register


def milp_mapping(
    problem: PipelineProblem,
    replicate: bool = True,
    time_limit: float | None = None,
    max_replicas: int | None = None,
) -> tuple[float, Mapping, dict]:
    """(objective, mapping, info) of the MILP; raises Infeasible."""
    L = problem.length
    devs = problem.platform.devices
    P = len(devs)
    R = 1 if not replicate else min(P, max_replicas or P)
    ivs = [(i, j) for i in range(L) for j in range(i + 1, L + 1)]
    nI = len(ivs)
    index: dict = {}

    def var(*key) -> int:
        if key not in index:
            index[key] = len(index)
        return index[key]

    for a in range(nI):
        var("y", a)
        for u in range(P):
            var("x", a, u)
        for r in range(1, R + 1):
            var("z", a, r)
    for k in range(1, L):
        for u in range(P):
            for r in range(1, R + 1):
                var("end", k, u, r)
                var("start", k, u, r)
    nb = len(index)
    T = nb  # the last column is the period
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(coefs: dict, lower: float, upper: float) -> None:
        r = len(lo)
        for c, v in coefs.items():
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    ends_at = {k: [a for a, (i, j) in enumerate(ivs) if j == k] for k in range(L + 1)}
    starts_at = {k: [a for a, (i, j) in enumerate(ivs) if i == k] for k in range(L + 1)}
    row({var("y", a): 1 for a in starts_at[0]}, 1, 1)
    row({var("y", a): 1 for a in ends_at[L]}, 1, 1)
    for k in range(1, L):
        coefs = {var("y", a): 1.0 for a in ends_at[k]}
        coefs.update({var("y", a): -1.0 for a in starts_at[k]})
        row(coefs, 0, 0)
    for u in range(P):
        row({var("x", a, u): 1 for a in range(nI)}, -np.inf, 1)
    speeds = [d.speed for d in devs]
    big = 0.0
    for a, (i, j) in enumerate(ivs):
        row({var("z", a, r): 1 for r in range(1, R + 1)} | {var("y", a): -1}, 0, 0)
        row({var("x", a, u): 1 for u in range(P)}
            | {var("z", a, r): -r for r in range(1, R + 1)}, 0, 0)  # fmt: skip
        need = interval_memory(problem, i, j)
        W = problem.work(i, j)
        for u in range(P):
            row({var("x", a, u): 1, var("y", a): -1}, -np.inf, 0)
            cap = devs[u].memory
            if cap is not None and need > cap:
                row({var("x", a, u): 1}, 0, 0)
            for r in range(1, R + 1):
                c = W / (r * speeds[u])
                big = max(big, c)
                # T >= c (x + z - 1)  <=>  c x + c z - T <= c
                row({var("x", a, u): c, var("z", a, r): c, T: -1}, -np.inf, c)
    x = problem.chain.in_size
    for k in range(1, L):
        for u in range(P):
            for r in range(1, R + 1):
                for side, group in (("end", ends_at[k]), ("start", starts_at[k])):
                    coefs = {var(side, k, u, r): -1.0}
                    for a in group:
                        coefs[var("x", a, u)] = coefs.get(var("x", a, u), 0) + 1
                        coefs[var("z", a, r)] = coefs.get(var("z", a, r), 0) + 1
                    row(coefs, -np.inf, 1)
        for u, v in itertools.permutations(range(P), 2):
            t = link_time(problem, devs[u].name, devs[v].name, x[k])
            if math.isinf(t):
                coefs = {var("x", a, u): 1 for a in ends_at[k]}
                coefs.update({var("x", a, v): 1 for a in starts_at[k]})
                row(coefs, -np.inf, 1)
                continue
            for ra in range(1, R + 1):
                for rb in range(1, R + 1):
                    c = t / math.lcm(ra, rb)
                    big = max(big, c)
                    row({var("end", k, u, ra): c, var("start", k, v, rb): c, T: -1}, -np.inf, c)
    A = sp.csr_matrix((vals, (rows, cols)), shape=(len(lo), nb + 1))
    lo_v, hi_v = np.array(lo), np.array(hi)
    v = cp.Variable(nb, boolean=True)
    t = cp.Variable(nonneg=True)
    expr = A[:, :nb] @ v + A[:, nb].toarray().ravel() * t
    cons = []
    fin_hi, fin_lo = np.isfinite(hi_v), np.isfinite(lo_v)
    cons.append(expr[np.flatnonzero(fin_hi)] <= hi_v[fin_hi])
    cons.append(expr[np.flatnonzero(fin_lo)] >= lo_v[fin_lo])
    prob = cp.Problem(cp.Minimize(t), cons)
    opts = {"time_limit": float(time_limit)} if time_limit is not None else {}
    start = time.perf_counter()
    prob.solve(solver=cp.HIGHS, **opts)
    elapsed = time.perf_counter() - start
    if v.value is None or prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT):
        raise Infeasible("pipeline_milp", 0, None, f"MILP status {prob.status}")
    val = np.round(v.value).astype(int)
    chosen = []
    for a, (i, j) in enumerate(ivs):
        if val[index["y", a]]:
            names = tuple(devs[u].name for u in range(P) if val[index["x", a, u]])
            chosen.append(Interval(i, j, names))
    mapping = Mapping(tuple(sorted(chosen, key=lambda iv: iv.first)))
    info = {"status": prob.status, "milp_time": elapsed, "variables": nb + 1, "rows": len(lo)}
    return float(t.value), mapping, info


@register(
    "pipeline_milp",
    problem=PipelineProblem,
    exact=True,
    description="interval mapping with replication, heterogeneous devices and links (MILP)",
)
def pipeline_milp(
    problem: PipelineProblem,
    budget: int = 0,
    *,
    replicate: bool = True,
    time_limit: float | None = None,
    max_replicas: int | None = None,
):
    """``budget`` is unused: the memory limits are the devices' capacities."""
    obj, mapping, info = milp_mapping(problem, replicate, time_limit, max_replicas)
    return mapping_schedule(problem, mapping, "pipeline_milp", model_period=obj, milp=info)
