"""MILP for interval mapping with replication on heterogeneous devices (``"pipeline_milp"``).

Binary variables, for every candidate interval I = [i, j), device u, count r:
``y[I]`` (I is one of the intervals), ``x[I, u]`` (u runs a replica of I),
``z[I, r]`` (I has r replicas), and for every boundary k and count a,
``end[k, u, a]`` / ``start[k, u, a]`` (u runs the interval ending / starting at k,
which has a replicas). With T the period:

- the chosen intervals form a path 0 -> L: sum_{I from 0} y = 1, flow conservation
  at every boundary, sum_{I to L} y = 1;
- every device runs at most one interval; x[I, u] <= y[I]; sum_r z[I, r] = y[I];
  sum_u x[I, u] = sum_r r z[I, r];
- compute: T >= W(I) / (r speed_u) (x[I, u] + z[I, r] - 1);
- links: end[k, u, a] >= sum_{I to k} (x[I, u] + z[I, a]) - 1, likewise start; then
  T >= t_uv(x_k) / lcm(a, b) (end[k, u, a] + start[k, v, b] - 1), and u, v may not face
  each other across k when there is no link u -> v;
- memory (``schedir.steady.buffer_counts``): a replica of I = [i, j) with r
  replicas after an interval of a replicas and before one of b holds
  1 + a / gcd(a, r) copies of a_i and 1 + b / gcd(r, b) of a_j. With
  w_end[k, a] = sum_{I to k} z[I, a] (1 iff the interval ending at k has a replicas)
  and continuous m_in, m_out >= 0:
  m_in[I, u] >= (a / gcd(a, r) - 1) x_i (x[I, u] + z[I, r] + w_end[i, a] - 2), likewise
  m_out, and need_2(I) x[I, u] + m_in + m_out <= capacity_u, where need_2 is the need
  with 2 and 2 copies.

The memory model also charges upstream intervals whose replicas differ in speed or
links (their items arrive unevenly); that part is not linear, so it is added lazily:
when the optimum's mapping does not fit by ``schedir.steady.evaluate``, a cut
forbids the intervals (with their exact device sets) up to the one after the first
interval that does not fit, and the MILP is solved again. The linear rows only drop
non-negative terms, so the loop ends at an optimum of the full model.

The link term charges every pair of replicas (``pairs="all"`` in
``schedir.steady.evaluate``), an order-free bound that equals the exact round-robin
term when gcd(a, b) = 1 or the links are identical; the reported ``period`` is the exact
one of the returned order (never larger). Minimizing T gives the optimum of this model,
checked against exhaustive search in the tests. HiGHS (highspy), with no MIP gap.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from schedir.pipeline.problem import Interval, Mapping, PipelineProblem, capacity, link_time
from schedir.steady import evaluate, interval_memory, mapping_memory
from solvers._highs import quiet_highs, run
from solvers.pipeline.dp import mapping_schedule, require_inference
from solvers.registry import Infeasible, register


class _Rows:
    """Sparse rows lower <= sum coef * column <= upper over named columns."""

    def __init__(self) -> None:
        self.index: dict = {}
        self.continuous: list[int] = []
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []

    def var(self, *key, continuous: bool = False) -> int:
        if key not in self.index:
            self.index[key] = len(self.index)
            if continuous:
                self.continuous.append(self.index[key])
        return self.index[key]

    def add(self, coefs: dict, lower: float, upper: float) -> None:
        r = len(self.lo)
        for c, v in coefs.items():
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lo.append(lower)
        self.hi.append(upper)


def _build(problem: PipelineProblem, R: int, budget: int | None) -> tuple[_Rows, list]:
    L = problem.length
    devs = problem.platform.devices
    P = len(devs)
    ivs = [(i, j) for i in range(L) for j in range(i + 1, L + 1)]
    m = _Rows()
    T = m.var("T", continuous=True)
    for a in range(len(ivs)):
        m.var("y", a)
        for u in range(P):
            m.var("x", a, u)
        for r in range(1, R + 1):
            m.var("z", a, r)
    ends_at = {k: [a for a, (i, j) in enumerate(ivs) if j == k] for k in range(L + 1)}
    starts_at = {k: [a for a, (i, j) in enumerate(ivs) if i == k] for k in range(L + 1)}
    m.add({m.var("y", a): 1 for a in starts_at[0]}, 1, 1)
    m.add({m.var("y", a): 1 for a in ends_at[L]}, 1, 1)
    for k in range(1, L):
        coefs = {m.var("y", a): 1.0 for a in ends_at[k]}
        coefs.update({m.var("y", a): -1.0 for a in starts_at[k]})
        m.add(coefs, 0, 0)
    for u in range(P):
        m.add({m.var("x", a, u): 1 for a in range(len(ivs))}, -np.inf, 1)
    x = problem.chain.in_size
    for a, (i, j) in enumerate(ivs):
        m.add({m.var("z", a, r): 1 for r in range(1, R + 1)} | {m.var("y", a): -1}, 0, 0)
        m.add({m.var("x", a, u): 1 for u in range(P)}
              | {m.var("z", a, r): -r for r in range(1, R + 1)}, 0, 0)  # fmt: skip
        W = problem.work(i, j)
        for u in range(P):
            m.add({m.var("x", a, u): 1, m.var("y", a): -1}, -np.inf, 0)
            for r in range(1, R + 1):
                c = W / (r * devs[u].speed)
                # T >= c (x + z - 1)  <=>  c x + c z - T <= c
                m.add({m.var("x", a, u): c, m.var("z", a, r): c, T: -1}, -np.inf, c)
            _memory_rows(problem, m, a, i, j, u, R, capacity(problem, devs[u].name, budget),
                         ends_at, starts_at)  # fmt: skip
    for k in range(1, L):
        for u in range(P):
            for r in range(1, R + 1):
                for side, group in (("end", ends_at[k]), ("start", starts_at[k])):
                    coefs = {m.var(side, k, u, r): -1.0}
                    for a in group:
                        coefs[m.var("x", a, u)] = coefs.get(m.var("x", a, u), 0) + 1
                        coefs[m.var("z", a, r)] = coefs.get(m.var("z", a, r), 0) + 1
                    m.add(coefs, -np.inf, 1)
        for u, v in itertools.permutations(range(P), 2):
            t = link_time(problem, devs[u].name, devs[v].name, x[k])
            if math.isinf(t):
                coefs = {m.var("x", a, u): 1 for a in ends_at[k]}
                coefs.update({m.var("x", a, v): 1 for a in starts_at[k]})
                m.add(coefs, -np.inf, 1)
                continue
            for ra in range(1, R + 1):
                for rb in range(1, R + 1):
                    c = t / math.lcm(ra, rb)
                    m.add({m.var("end", k, u, ra): c, m.var("start", k, v, rb): c, T: -1},
                          -np.inf, c)  # fmt: skip
    return m, ivs


def _memory_rows(problem, m: _Rows, a, i, j, u, R, cap, ends_at, starts_at) -> None:
    """The local memory rows of replica u of interval a = [i, j) (module docstring)."""
    if cap is None:
        return
    L, x = problem.length, problem.chain.in_size
    base = interval_memory(problem, i, j)  # 2 copies of a_i and of a_j
    if base > cap:
        m.add({m.var("x", a, u): 1}, 0, 0)
        return
    extra_in = [(r, b, (b // math.gcd(b, r) - 1) * x[i]) for r in range(1, R + 1)
                for b in range(1, R + 1)] if i > 0 else []  # fmt: skip
    extra_out = [(r, b, (b // math.gcd(r, b) - 1) * x[j]) for r in range(1, R + 1)
                 for b in range(1, R + 1)] if j < L else []  # fmt: skip
    extra_in = [e for e in extra_in if e[2] > 0]
    extra_out = [e for e in extra_out if e[2] > 0]
    most = max((e[2] for e in extra_in), default=0) + max((e[2] for e in extra_out), default=0)
    if base + most <= cap:
        return
    unit = float(max(cap, 1))  # bytes in units of the capacity: rows of order 1
    need = {m.var("x", a, u): base / unit}
    for name, extras, group in (("m_in", extra_in, ends_at[i]), ("m_out", extra_out, starts_at[j])):
        if not extras:
            continue
        col = m.var(name, a, u, continuous=True)
        need[col] = 1.0
        for r, b, extra in extras:
            # col >= e (x + z[a, r] + w[b] - 2), i.e. e (x + z + w) - col <= 2 e
            e = extra / unit
            coefs = {col: -1.0, m.var("x", a, u): e, m.var("z", a, r): e}
            for n in group:
                key = m.var("z", n, b)
                coefs[key] = coefs.get(key, 0.0) + e
            m.add(coefs, -np.inf, 2.0 * e)
    m.add(need, -np.inf, cap / unit)


def _cut(problem: PipelineProblem, m: _Rows, ivs: list, mapping: Mapping, budget) -> dict | None:
    """Coefficients of a cut forbidding the prefix of ``mapping`` that does not fit, or
    None if every replica fits."""
    intervals = mapping.intervals
    needs = mapping_memory(problem, intervals)
    where = {iv: ivs.index((iv.first, iv.last)) for iv in intervals}
    names = [d.name for d in problem.platform.devices]
    for g, (iv, need) in enumerate(zip(intervals, needs, strict=True)):
        caps = [capacity(problem, u, budget) for u in iv.devices]
        if all(c is None or need <= c for c in caps):
            continue
        coefs = {}
        for h in intervals[: g + 2]:
            a = where[h]
            coefs.update({m.index["x", a, names.index(u)]: 1.0 for u in h.devices})
            coefs[m.index["z", a, len(h.devices)]] = 1.0
        return coefs
    return None


@dataclass(frozen=True)
class HighsOutcome:
    """How a HiGHS solve ended: its ``status``, the model's ``variables`` and ``rows``,
    whether it was ``time_limited`` and then ``lower_bound`` (the solver's bound on the
    optimum of the model, in seconds; None when not time-limited or unknown)."""

    status: str
    variables: int
    rows: int
    time_limited: bool
    lower_bound: float | None = None

    @classmethod
    def of(cls, highs, variables: int, rows: int, scale: float) -> HighsOutcome:
        """The outcome of ``highs``'s last run (its objective in units of ``scale``)."""
        status = highs.getModelStatus()
        limited = status == highspy.HighsModelStatus.kTimeLimit
        bound = float(highs.getInfo().mip_dual_bound) * scale
        return cls(status.name, variables, rows, limited,
                   bound if limited and math.isfinite(bound) else None)  # fmt: skip

    def report(self) -> dict:
        """These facts for a schedule's meta."""
        out = {"status": self.status, "variables": self.variables, "rows": self.rows,
               "time_limited": self.time_limited}  # fmt: skip
        if self.lower_bound is not None:
            out["lower_bound"] = self.lower_bound
        return out


@dataclass(frozen=True)
class MilpMapping:
    """What :func:`milp_mapping` found: the MILP's ``objective`` (seconds per item),
    its ``mapping``, the ``milp_time`` (seconds) of its ``rounds`` of solves (cuts + 1)
    and how the last one ended (``outcome``; a time-limited answer is the best
    mapping found, with the bound on the optimum when HiGHS has one)."""

    objective: float
    mapping: Mapping
    milp_time: float
    rounds: int
    outcome: HighsOutcome


def milp_mapping(
    problem: PipelineProblem,
    replicate: bool = True,
    time_limit: float | None = None,
    max_replicas: int | None = None,
    budget: int | None = None,
    progress=None,
) -> MilpMapping:
    """The MILP's best mapping (:class:`MilpMapping`); raises Infeasible."""
    start = time.perf_counter()
    deadline = None if time_limit is None else start + float(time_limit)
    P = len(problem.platform.devices)
    R = 1 if not replicate else min(P, max_replicas or P)
    m, ivs = _build(problem, R, budget)
    n = len(m.index)
    # times in units of the whole chain on the fastest device, so that HiGHS's absolute
    # tolerances are relative ones
    scale = problem.work(0, problem.length) / max(d.speed for d in problem.platform.devices)
    scale = scale if scale > 0 else 1.0
    highs = _highs_model(m, n, scale)
    rounds, limited = 0, False
    while True:
        if deadline is not None:
            highs.setOptionValue("time_limit", max(0.01, deadline - time.perf_counter()))
        if progress is not None:
            done = 0.0 if deadline is None else (time.perf_counter() - start) / time_limit
            progress(min(done, 1.0), f"pipeline_milp: solve {rounds + 1} ({len(m.lo)} rows)")
        highs.setOptionValue("presolve", "choose")
        run(highs)
        status = highs.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            # confirm without presolve before calling a problem infeasible
            highs.setOptionValue("presolve", "off")
            run(highs)
            status = highs.getModelStatus()
        rounds += 1
        info = highs.getInfo()
        found = info.primal_solution_status == 2  # kSolutionStatusFeasible
        limited = limited or status == highspy.HighsModelStatus.kTimeLimit
        if not found or status not in (highspy.HighsModelStatus.kOptimal,
                                       highspy.HighsModelStatus.kTimeLimit):  # fmt: skip
            why = ("the time limit was reached before any mapping was found" if limited
                   else "no mapping fits the devices' memory")  # fmt: skip
            raise Infeasible("pipeline_milp", budget, None, f"{why} (HiGHS: {status.name})")
        val = np.asarray(highs.getSolution().col_value)
        mapping = _decode(problem, m, ivs, np.round(val).astype(int))
        cut = _cut(problem, m, ivs, mapping, budget)
        if cut is None:
            break
        if limited:
            why = "the time limit was reached before a mapping that fits was found"
            raise Infeasible("pipeline_milp", budget, None, why)
        cols = np.array(list(cut), dtype=np.int32)
        highs.addRow(-highspy.kHighsInf, len(cut) - 1.0, len(cols), cols, np.ones(len(cols)))
    outcome = HighsOutcome.of(highs, n, len(m.lo) + rounds - 1, scale)
    return MilpMapping(float(val[m.index["T",]]) * scale, mapping, time.perf_counter() - start,
                       rounds, outcome)  # fmt: skip


def _highs_model(m: _Rows, n: int, scale: float):
    """The rows of ``m`` as a HiGHS model: T (column m.index["T"]) in units of ``scale``."""
    A = sp.csr_matrix((m.vals, (m.rows, m.cols)), shape=(len(m.lo), n)).tolil()
    t = m.index["T",]
    A[:, t] = A[:, t] * scale
    A = A.tocsc()
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, len(m.lo)
    cost = np.zeros(n)
    cost[t] = 1.0
    lower, upper = np.zeros(n), np.ones(n)
    cont = np.zeros(n, dtype=bool)
    cont[m.continuous] = True
    upper[cont] = inf
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lower, upper
    lp.row_lower_ = np.where(np.isfinite(m.lo), m.lo, -inf)
    lp.row_upper_ = np.where(np.isfinite(m.hi), m.hi, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    kinds = highspy.HighsVarType
    lp.integrality_ = [kinds.kContinuous if c else kinds.kInteger for c in cont]
    highs = quiet_highs()
    for name, value in (("mip_rel_gap", 0.0), ("mip_abs_gap", 0.0)):
        highs.setOptionValue(name, value)
    highs.passModel(lp)
    return highs


def _decode(problem, m: _Rows, ivs, val) -> Mapping:
    devs = problem.platform.devices
    chosen = []
    for a, (i, j) in enumerate(ivs):
        if val[m.index["y", a]]:
            names = tuple(d.name for u, d in enumerate(devs) if val[m.index["x", a, u]])
            chosen.append(Interval(i, j, names))
    return Mapping(tuple(sorted(chosen, key=lambda iv: iv.first)))


@register(
    "pipeline_milp",
    problem=PipelineProblem,
    exact=True,
    description="interval mapping with replication, heterogeneous devices and links (MILP)",
)
def pipeline_milp(
    problem: PipelineProblem,
    budget: int | None = None,
    *,
    replicate: bool = True,
    time_limit: float | None = None,
    max_replicas: int | None = None,
    progress=None,
):
    """``budget`` (bytes, optional) bounds every device besides its own memory.
    ``time_limit`` (seconds) bounds the whole solve; an answer found under it is the
    best mapping found (``meta["time_limited"]``, ``meta["lower_bound"]``), not an
    optimum. ``max_replicas`` restricts the model (the answer is exact for it)."""
    require_inference(problem, "pipeline_milp")
    got = milp_mapping(problem, replicate, time_limit, max_replicas, budget, progress)
    # the model's period of the mapping, recomputed (the MILP's T carries its tolerances)
    model_period = evaluate(problem, got.mapping, pairs="all").period
    end = got.outcome
    meta = {"model_period": model_period, "exact": not end.time_limited,
            "milp": {**end.report(), "milp_time": got.milp_time, "rounds": got.rounds,
                     "objective": got.objective}}  # fmt: skip
    if end.time_limited:
        meta["time_limited"] = True
        if end.lower_bound is not None:
            meta["lower_bound"] = end.lower_bound
    return mapping_schedule(problem, got.mapping, "pipeline_milp", **meta)
