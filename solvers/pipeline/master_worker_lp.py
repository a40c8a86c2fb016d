"""Steady-state master-worker LP and its bandwidth-centric closed form (``"master_worker_lp"``).

Banino, Beaumont, Carter, Dongarra, Legrand and Robert, "Scheduling strategies for
master-slave tasking on heterogeneous processor platforms", IEEE TPDS 15(4), 2004.
A tree rooted at the master; node u computes a task in w_u seconds; sending a task
from a parent to child v takes c_v seconds; a node computes, receives and sends at the
same time but sends to one child at a time (one-port). With alpha_u the tasks per
second computed by u and f_v the tasks per second sent to v, the steady state is

    maximize   sum_u alpha_u
    subject to alpha_u w_u <= 1                             (compute)
               sum_{v child of u} f_v c_v <= 1              (u's one sending port)
               f_v = alpha_v + sum_{x child of v} f_x       (what v receives, it uses)
               alpha, f >= 0.

(Receiving is bounded by the parent's port: f_v c_v <= 1 is implied.) On a star the
optimum is bandwidth-centric: the master computes at 1 / w_0, and serves the workers
by increasing c_v, each fully (1 / w_v) while the port has room, the next one with
the rest of the port, the others not at all (:func:`bandwidth_centric`).
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.optimize import linprog

from schedir.steady import MasterWorker, SteadyState
from solvers.registry import register


def steady_state_lp(problem: MasterWorker) -> SteadyState:
    """Solve the LP above (HiGHS through scipy.optimize.linprog)."""
    kids = problem.children()
    nodes = [problem.master] + [u for u in kids if u != problem.master]
    reach = {problem.master}
    for u in nodes:
        if u in reach:
            reach.update(kids[u])
    nodes = [u for u in nodes if u in reach]
    n = len(nodes)
    pos = {u: k for k, u in enumerate(nodes)}
    children = [v for v in nodes if v != problem.master]
    fpos = {v: n + k for k, v in enumerate(children)}
    nv = n + len(children)
    A_ub, b_ub, A_eq, b_eq = [], [], [], []
    bounds = [(0, None)] * nv
    for u in nodes:
        w = problem.compute_time(u)
        if math.isinf(w):
            bounds[pos[u]] = (0, 0)
        elif w > 0:
            row = np.zeros(nv)
            row[pos[u]] = w
            A_ub.append(row)
            b_ub.append(1.0)
        if kids[u]:
            row = np.zeros(nv)
            for v in kids[u]:
                row[fpos[v]] = problem.comm_time(u, v)
            A_ub.append(row)
            b_ub.append(1.0)
    for v in children:
        row = np.zeros(nv)
        row[fpos[v]] = 1.0
        row[pos[v]] = -1.0
        for x in kids[v]:
            row[fpos[x]] = -1.0
        A_eq.append(row)
        b_eq.append(0.0)
    c = np.zeros(nv)
    c[:n] = -1.0
    start = time.perf_counter()
    res = linprog(c, A_ub=np.array(A_ub) if A_ub else None, b_ub=b_ub or None,
                  A_eq=np.array(A_eq) if A_eq else None, b_eq=b_eq or None,
                  bounds=bounds, method="highs")  # fmt: skip
    if res.status != 0:
        raise ValueError(f"master_worker_lp: LP failed ({res.message}); is a time zero?")
    alpha = {u: float(res.x[pos[u]]) for u in nodes}
    send = {(p, v): float(res.x[fpos[v]]) for p in nodes for v in kids[p]}
    meta = {"method": "master_worker_lp", "solve_time": time.perf_counter() - start,
            "exact": True}  # fmt: skip
    return SteadyState(float(-res.fun), alpha, send, meta)


def bandwidth_centric(problem: MasterWorker) -> SteadyState:
    """The closed form for a star (every worker a child of the master)."""
    kids = problem.children()
    master = problem.master
    if any(kids[v] for v in kids[master]):
        raise ValueError("bandwidth_centric: the platform is not a star around the master")
    w0 = problem.compute_time(master)
    alpha = {master: 0.0 if math.isinf(w0) else 1.0 / w0}
    send, port = {}, 1.0
    for v in sorted(kids[master], key=lambda v: problem.comm_time(master, v)):
        c, w = problem.comm_time(master, v), problem.compute_time(v)
        rate = 1.0 / w if port > 0 else 0.0
        if c > 0:
            rate = min(rate, port / c)
        alpha[v] = rate
        send[master, v] = rate
        port -= rate * c
    total = sum(alpha.values())
    return SteadyState(total, alpha, send, {"method": "bandwidth_centric"})


@register(
    "master_worker_lp",
    problem=MasterWorker,
    exact=True,
    description="steady-state throughput LP of Banino et al. (2004), star or tree, one-port",
)
def master_worker_lp(problem: MasterWorker, budget: int = 0) -> SteadyState:
    """``budget`` is unused. Returns a SteadyState (not a Schedule): see docs/pipelines.md."""
    return steady_state_lp(problem)
