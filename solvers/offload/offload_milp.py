"""``offload_milp``: the rotor_offload model as a MILP over schedule trees (cvxpy + HiGHS).

The same problem as :mod:`solvers.rotor_offload` (its module doc states the model),
written independently as a mixed-integer program so that the two cross-check each
other on small chains. A persistent schedule is a tree of sub-chains (i, t) with the
kind of their input (``a[i]`` or ``abar[i]``); every interval occurs at most once in a
tree, so each node (i, t, kind) gets

- one binary per move (leaf; record; split at j; record-offload; split-offload at j),
  whose sum is 1 if the node is in the tree (the root is) and equals the sum of the
  parent moves that create it otherwise;
- a continuous ``M[i, t, kind] >= 0``, the memory besides the input buffer, with
  ``M[root] <= budget - x_0``, ``M[n] >= need(move) * y(move)`` and, for every child
  c that a move creates with memory shift delta,
  ``M[c] <= M[n] + delta + BigM (1 - y(move))``.

The objective is the sum of the move costs (seconds). Move costs and needs are written
here in scalar form, independently of the DP's vectorized code. Beaumont,
Eyraud-Dubois, Shilova (NeurIPS 2021) for the remat + offload setting.
"""

from __future__ import annotations

import math

import numpy as np

from schedir import OffloadProblem, OffloadSchedule
from solvers._highs import quiet_stdout, silence_banner
from solvers.offload.rotor_offload import Model, build_table, check_budget, emit, slot_for
from solvers.registry import Infeasible, register

DP_UNITS = 20_000  # the DP confirms infeasibility when its table has at most this width


def tree_moves(model: Model) -> dict:
    """{(i, t, kind): [(label, j, cost, need, [(child, delta), ...]), ...]} (sizes in units)."""
    c, tm = model.chain, model.times
    L = c.length
    x = list(c.in_size) + [0]
    s, ft, bt = c.saved_size, c.fwd_tmp, c.bwd_tmp
    fwd, bwd = tm.fwd_time, tm.bwd_time

    def last(j: int) -> float:
        return bwd[j] + (fwd[L] if j == L else 0.0)

    def bn(j: int) -> int:  # the last op of stage j: B(j), or the loss (d_L, temporary)
        return x[L] + bt[L] if j == L else x[j] + x[j + 1] + s[j] + bt[j]

    moves: dict = {}
    for i in range(L + 1):
        for t in range(i, L + 1):
            for kind in (0, 1):
                if kind == 1 and i == 0:
                    continue
                node = (i, t, kind)
                if i == t:
                    need = bn(i) if i == L else max(x[i + 1] + s[i] + ft[i], bn(i))
                    moves[node] = [("leaf", None, fwd[i] + bwd[i], need, [])]
                    continue
                out = []
                fn = x[t + 1] + s[i] + ft[i]
                out.append(
                    ("record", None, fwd[i] + bwd[i], max(fn, bn(i)), [((i + 1, t, 1), -s[i])])
                )
                for j in range(i + 1, t + 1):
                    # F_ck(i) F_n(i+1..j-1), or F_all(i) first when abar[i+1] is smaller
                    y = min(x[i + 1], s[i]) if j >= i + 2 else x[i + 1]
                    ops = [y + ft[i]] + [x[k] + x[k + 1] + ft[k] for k in range(i + 1, j)]
                    if j >= i + 2:
                        ops[1] = y + x[i + 2] + ft[i + 1]
                    seg = x[t + 1] + max(ops)
                    cost = sum(fwd[i:j])
                    kids = [((j, t, 0), -x[j]), ((i, j - 1, kind), 0)]
                    out.append(("split", j, cost, seg, kids))
                    z = x[i] if kind == 0 else s[i - 1]
                    t_off, t_pre = model.t_off[kind][i], model.t_pre[kind][i]
                    if math.isfinite(t_off) and math.isfinite(t_pre):
                        cost = max(cost, t_off) + max(0.0, t_pre - last(j))
                        kids = [((j, t, 0), z - x[j]), ((i, j - 1, kind), 0)]
                        out.append(("split_off", j, cost, max(seg, bn(j) + x[j]), kids))
                z = x[i] if kind == 0 else s[i - 1]
                t_off, t_pre = model.t_off[kind][i], model.t_pre[kind][i]
                if math.isfinite(t_off) and math.isfinite(t_pre):
                    cost = max(fwd[i], t_off) + max(0.0, t_pre - last(i + 1)) + bwd[i]
                    need = max(fn, bn(i), s[i] + bn(i + 1))
                    out.append(("record_off", None, cost, need, [((i + 1, t, 1), z - s[i])]))
                moves[node] = out
    return moves


def solve_milp(model: Model, memory: int, *, time_limit: float | None = None):
    """(value, {node: (label, j)}, status) of the MILP for ``memory`` units besides x_0
    (value inf and no moves when it has no solution; status is cvxpy's)."""
    import cvxpy as cp

    moves = tree_moves(model)
    nodes = list(moves)
    index = {n: k for k, n in enumerate(nodes)}
    flat = [(n, mv) for n in nodes for mv in moves[n]]
    y = cp.Variable(len(flat), boolean=True)
    M = cp.Variable(len(nodes), nonneg=True)
    c = model.chain
    big = memory + sum(c.in_size) + sum(c.saved_size) + 1
    root = (0, c.length, 0)
    cons = [M[index[root]] <= memory]
    creators: dict = {n: [] for n in nodes}
    per_node: dict = {n: [] for n in nodes}
    for k, (n, (_, _, _, need, kids)) in enumerate(flat):
        per_node[n].append(k)
        if need > 0:
            cons.append(M[index[n]] >= need * y[k])
        for child, delta in kids:
            creators[child].append(k)
            cons.append(M[index[child]] <= M[index[n]] + delta + big * (1 - y[k]))
    for n in nodes:
        total = cp.sum(y[per_node[n]])
        active = 1 if n == root else (cp.sum(y[creators[n]]) if creators[n] else 0)
        cons.append(total == active)
    cost = np.array([mv[2] for _, mv in flat])
    prob = cp.Problem(cp.Minimize(cost @ y), cons)
    opts = {"time_limit": time_limit} if time_limit else {}
    silence_banner()
    with quiet_stdout():
        prob.solve(solver=cp.HIGHS, **opts)
    if y.value is None:
        return math.inf, {}, prob.status
    chosen = {n: (mv[0], mv[1]) for (n, mv), v in zip(flat, y.value, strict=True) if v > 0.5}
    return float(cost @ np.round(y.value)), chosen, prob.status


@register(
    "offload_milp",
    problem=OffloadProblem,
    exact=True,
    description="rotor_offload's model as a MILP over schedule trees (small chains; cvxpy/HiGHS)",
)
def offload_milp(
    problem: OffloadProblem, budget: int, *, max_stages: int = 8, time_limit: float | None = 60.0
) -> OffloadSchedule:
    """Optimal schedule of the rotor_offload model by MILP (exact in bytes; small chains).

    Infeasibility is confirmed by the DP (the same model, exact in bytes), which also
    gives ``min_budget``; a MILP that finds nothing where the DP does is an error, not
    an Infeasible. Under ``time_limit`` the answer may be an incumbent:
    ``meta["exact"]`` is then False and ``meta["time_limited"]`` True.
    """
    check_budget(problem, budget)
    # a finite MILP: nothing needs more than recording every stage
    budget = min(budget, problem.chain.in_size[0] + Model.of(problem).store_all_need())
    L = problem.chain.length
    if L > max_stages:
        raise ValueError(f"offload_milp: {L} stages > max_stages = {max_stages}; use rotor_offload")
    model = Model.of(problem)
    slot, exact = slot_for(problem, DP_UNITS, 1)
    table = build_table(problem, slot) if exact else None  # the DP, exact in bytes
    if table is not None and not math.isfinite(table.value(budget)):
        least = table.min_budget()
        raise Infeasible("offload_milp", budget, least, "" if least else "no budget fits")
    memory = budget - problem.chain.in_size[0]
    value, chosen, status = solve_milp(model, memory, time_limit=time_limit)
    if not math.isfinite(value) and table is None:
        raise Infeasible("offload_milp", budget, None, f"the MILP found no schedule ({status})")
    if not math.isfinite(value):
        raise RuntimeError(
            f"offload_milp: the MILP found no schedule (status {status}) at budget {budget}, "
            f"where the DP of the same model finds {table.value(budget)} s"
        )

    def choose(i: int, t: int, kind: int, m: int):
        return chosen[i, t, kind]

    ops = emit(
        model,
        choose,
        memory,
        memory + sum(problem.chain.in_size) + sum(problem.chain.saved_size) + 2,
    )
    optimal = status == "optimal"
    meta = {"milp_value": value, "exact": optimal, "milp_status": status}
    if not optimal:
        meta["time_limited"] = True
        if table is not None:
            meta["lower_bound"] = table.value(budget)  # the DP's optimum of the same model
    return OffloadSchedule(ops, meta)
