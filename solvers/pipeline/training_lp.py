"""An upper bound on the throughput of any run of a task graph: a steady-state LP.

The LP relaxes everything :class:`schedir.dynamic.RuntimeState` allows (any
placement of every task, one kind of task split over several devices, parameters
copied anywhere, offloading and dropping with recomputation), so no run, simulated or
measured, exceeds its value when it is given that run's task durations
(:func:`bound_of_trace`); with the profile's durations (:func:`training_lp`) it bounds
every run at zero noise. Derivation (docs/dynamic_training.md):

A run of ``I`` items in ``T`` seconds has throughput rho = I / T. Divide every count
by T: ``n[k, u]`` tasks of kind k per second on device u, with
``sum_u n[k, u] = rho c_k / I`` (c_k tasks of kind k in the graph).

- **Compute.** A device runs one task at a time: ``sum_k n[k, u] D[k, u] + sum_j
  r[j, u] Drec[j, u] <= 1`` (D: seconds of a kind on u; r: recomputations of data
  type j on u).
- **Memory, Little's law.** A datum produced by a task lives from its producer's start
  to its last reader's end, so at least R_j, the longest chain of task durations
  from its producer to a reader (the forward/backward dependency: a stash lives from
  its F through every later F and B to its B). If an instance is never offloaded or
  dropped it is on some device all that time, so with K[j, u] the mean number of
  type-j instances on u, ``sum_u K[j, u] >= R_j (rho c_j / I - e_j)``, e_j the rate of
  offloads and drops. The data a task reads or writes that have no such lifetime
  (parameters, inputs, accumulators, outputs, temporaries: E_k bytes) are on its
  device while it runs. The time-average of a device's memory is then at least
  ``sum_j s_j K[j, u] + sum_k E_k n[k, u] D[k, u] (+ recomputations)`` and at most
  its capacity: in steady state, stash memory = rho x residence time x stash bytes.
- **Footprint.** A task runs on a device only if all it reads and writes and its
  temporaries fit there at once: ``n[k, u] = 0`` where they do not.
- **Transfers.** An instance read on v but not produced (or recomputed) there arrives
  over a link into v or from the host: ``sum_u y[j, u, v] + h[j, v] >= n[q, v] -
  n[p, v] - r[j, v]`` for each reader kind q (producer kind p); each link carries at
  most one second of transfers per second, ``sum_j y[j, u, v] t_uv(s_j) <= 1``, and so
  does each device's offload and prefetch engine (offloads o[j, u] count in e_j).

Maximize rho. A finite run is a point of this LP (its counts, busy times and memory
integrals divided by T), so rho* >= I / T. Durations: the profile's work / speed by
default; :func:`bound_of_trace` takes the run's own (mean per kind and device, each
task's own for R_j), which is what makes it a bound of a noisy or measured run.
Solved with HiGHS (``scipy.optimize.linprog``).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from schedir.dynamic import SOURCES, DynamicTrace, TaskGraph, data_layout
from schedir.platform import Platform

RESIDENT = ("activation", "stash", "gradient")  # produced, read later: a lifetime


@dataclass(frozen=True)
class SteadyBound:
    """The LP's answer.

    Attributes:
        throughput: items per second (an upper bound; inf if nothing limits it).
        rates: (task kind, device) -> tasks per second at the optimum.
        memory: device -> mean bytes at the optimum (the LP's lower bound of it).
        residence: data type -> seconds (R_j), its least lifetime.
        meta: solve_time (s), variables, constraints, status, links (modeled or not).
    """

    throughput: float
    rates: dict
    memory: dict
    residence: dict
    meta: dict = field(default_factory=dict)

    @property
    def period(self) -> float:
        """Seconds per item: 1 / throughput."""
        return 1 / self.throughput if self.throughput > 0 else math.inf


def training_lp(
    graph: TaskGraph,
    platform: Platform,
    *,
    durations: dict | None = None,
    recompute: dict | None = None,
    task_seconds: list | None = None,
    memory: dict | None = None,
    links: bool = True,
) -> SteadyBound:
    """The LP of the module docstring.

    ``durations``: (kind, device) -> seconds (default and for missing pairs: work /
    speed); ``recompute``: (kind of the producer, device) -> seconds of recomputing
    its output (default: ``durations``); ``task_seconds``: per task, the seconds that
    bound lifetimes (default: its least duration over the devices); ``memory``:
    device -> bytes in place of the devices' own; ``links``: model the links and
    host engines (a run whose transfers are not timed by them, such as the JAX
    runtime's, needs False).
    """
    start = time.perf_counter()
    lay = data_layout(graph)
    tasks = graph.tasks
    names = [d.name for d in platform.devices]
    speed = {d.name: d.speed for d in platform.devices}
    caps = {d.name: d.memory for d in platform.devices}
    caps.update(memory or {})
    kinds = list(dict.fromkeys(t.kind for t in tasks))
    count = defaultdict(int)
    for t in tasks:
        count[t.kind] += 1
    items = len({t.item for t in tasks if t.item is not None}) or 1
    work = {}
    for t in tasks:
        work.setdefault(t.kind, t.work)
    D = {(k, u): work[k] / speed[u] for k in kinds for u in names}
    D.update(durations or {})
    Drec = dict(D)
    Drec.update(recompute or {})
    if task_seconds is None:
        task_seconds = [min(D[t.kind, u] for u in names) for t in tasks]
    types, residence = _types(graph, lay, task_seconds)
    # execution bytes per kind: what a task holds while it runs besides lifetimes
    exec_bytes: dict = {}
    footprint: dict = {}
    for t, task in enumerate(tasks):
        whole = task.temp + sum(lay.size[d] for d in {*lay.reads[t], *lay.writes[t]})
        footprint[task.kind] = min(footprint.get(task.kind, whole), whole)
        held = task.temp + sum(lay.size[d] for d in (*lay.reads[t], *lay.writes[t])
                               if lay.kind[d] not in RESIDENT)  # fmt: skip
        exec_bytes[task.kind] = min(exec_bytes.get(task.kind, held), held)
    host = platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0
    lk = {(x.src, x.dst): x for x in platform.links} if links else {}

    var: dict = {}

    def v(*key) -> int:
        if key not in var:
            var[key] = len(var)
        return var[key]

    rows_ub: list = []
    rows_eq: list = []
    v("rho")
    for k in kinds:  # sum_u n = rho c_k / I
        rows_eq.append(({v("n", k, u): 1.0 for u in names} | {v("rho"): -count[k] / items}, 0.0))
    for u in names:
        row = {v("n", k, u): D[k, u] for k in kinds if D[k, u] > 0}
        for j, ty in types.items():
            if ty["drop"]:
                row[v("r", j, u)] = Drec[ty["producer"], u]
        rows_ub.append((row, 1.0))
        if caps[u] is not None:
            row = {v("K", j, u): ty["size"] for j, ty in types.items() if ty["size"] > 0}
            for k in kinds:
                if exec_bytes[k] and D[k, u] > 0:
                    row[v("n", k, u)] = exec_bytes[k] * D[k, u]
            for j, ty in types.items():
                if ty["drop"] and ty["rec_bytes"]:
                    row[v("r", j, u)] = (
                        row.get(v("r", j, u), 0.0) + ty["rec_bytes"] * Drec[ty["producer"], u]
                    )
            rows_ub.append((row, float(caps[u])))
    for j, ty in types.items():
        R, rate = residence[j], count_of(ty) / items
        if R <= 0 or ty["size"] == 0:
            continue
        # R (rho c_j / I - e_j) <= sum_u K[j, u]
        row = {v("K", j, u): -1.0 for u in names} | {v("rho"): R * rate}
        for u in names:
            if host:
                row[v("o", j, u)] = -R
            if ty["drop"]:
                row[v("r", j, u)] = -R
        rows_ub.append((row, 0.0))
    if links:
        for j, ty in types.items():
            if not ty["one_to_one"]:
                continue
            for q in ty["readers"]:
                if q == ty["producer"]:
                    continue
                for dst in names:
                    row = {v("n", q, dst): 1.0, v("n", ty["producer"], dst): -1.0}
                    for src in names:
                        if src != dst and (src, dst) in lk:
                            row[v("y", j, src, dst)] = -1.0
                    if host:
                        row[v("h", j, dst)] = -1.0
                    if ty["drop"]:
                        row[v("r", j, dst)] = -1.0
                    rows_ub.append((row, 0.0))
        for (src, dst), link in lk.items():
            row = {v("y", j, src, dst): link.time(ty["size"]) for j, ty in types.items()
                   if ty["one_to_one"] and link.time(ty["size"]) > 0}  # fmt: skip
            if row:
                rows_ub.append((row, 1.0))
        if host and links:
            for u in names:
                row = {v("o", j, u): platform.offload.time(ty["size"]) for j, ty in types.items()}
                rows_ub.append(({k: c for k, c in row.items() if c > 0}, 1.0))
                row = {v("h", j, u): platform.prefetch.time(ty["size"]) for j, ty in types.items()
                       if ty["one_to_one"]}  # fmt: skip
                rows_ub.append(({k: c for k, c in row.items() if c > 0}, 1.0))
    nv = len(var)
    c = np.zeros(nv)
    c[var["rho",]] = -1.0
    A_ub, b_ub = _matrix(rows_ub, nv)
    A_eq, b_eq = _matrix(rows_eq, nv)
    # a task whose inputs, outputs and temporaries exceed a device never runs there
    bounds = [(0, None)] * nv
    for (name, *key), k in var.items():
        if name == "n":
            kind, u = key
            if caps[u] is not None and footprint[kind] > caps[u]:
                bounds[k] = (0, 0)
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds,
                  method="highs")  # fmt: skip
    meta = {"solve_time": time.perf_counter() - start, "variables": nv,
            "constraints": len(rows_ub) + len(rows_eq), "links": links and bool(lk),
            "status": res.message}  # fmt: skip
    if res.status == 3:
        return SteadyBound(math.inf, {}, {}, residence, meta)
    if res.status != 0:
        raise ValueError(f"training_lp: the LP failed ({res.message})")
    x = res.x
    rates = {(k, u): float(x[var["n", k, u]]) for k in kinds for u in names}
    mem = {}
    for u in names:
        b = sum(ty["size"] * x[var["K", j, u]] for j, ty in types.items() if ("K", j, u) in var)
        b += sum(exec_bytes[k] * D[k, u] * rates[k, u] for k in kinds)
        mem[u] = float(b)
    return SteadyBound(float(x[var["rho",]]), rates, mem, residence, meta)


def count_of(ty: dict) -> int:
    return ty["count"]


def _matrix(rows: list, nv: int):
    if not rows:
        return None, None
    r, cidx, vals, b = [], [], [], []
    for i, (row, rhs) in enumerate(rows):
        for k, val in row.items():
            r.append(i)
            cidx.append(k)
            vals.append(val)
        b.append(rhs)
    return coo_matrix((vals, (r, cidx)), shape=(len(rows), nv)).tocsr(), np.array(b)


def _types(graph: TaskGraph, lay, task_seconds: list) -> tuple[dict, dict]:
    """Data with a lifetime grouped by type (kind, producer kind, reader kinds): their
    count, least size, whether droppable, one-to-one (each instance read by one task
    of each reader kind, each such task reading one instance), and R_j (the least
    over instances of the longest chain of ``task_seconds`` from producer to reader)."""
    tasks = graph.tasks
    succ = graph.successors()
    types: dict = {}
    residence: dict = {}
    longest: dict = {}
    for d, p in enumerate(lay.producer):
        if p is None or lay.kind[d] not in RESIDENT or lay.kind[d] in SOURCES:
            continue
        readers = lay.readers[d]
        if not readers:
            continue
        rkinds = tuple(sorted({tasks[r].kind for r in readers}))
        key = (lay.kind[d], tasks[p].kind, rkinds)
        ty = types.setdefault(key, {"count": 0, "size": lay.size[d], "drop": lay.droppable[d],
                                    "producer": tasks[p].kind, "readers": rkinds,
                                    "one_to_one": True, "rec_bytes": 0})  # fmt: skip
        ty["count"] += 1
        ty["size"] = min(ty["size"], lay.size[d])
        ty["drop"] = ty["drop"] and lay.droppable[d]
        if len(readers) != len(rkinds):
            ty["one_to_one"] = False
        if ty["drop"]:
            rec = tasks[p].temp + sum(lay.size[w] for w in lay.writes[p]
                                      if w != d and lay.kind[w] in RESIDENT)  # fmt: skip
            rec += sum(lay.size[r] for r in lay.reads[p] if lay.kind[r] not in RESIDENT)
            ty["rec_bytes"] = rec if ty["count"] == 1 else min(ty["rec_bytes"], rec)
        if p not in longest:
            longest[p] = _longest_from(p, succ, task_seconds)
        life = max(longest[p].get(r, -math.inf) for r in readers)
        residence[key] = min(residence.get(key, math.inf), max(life, 0.0))
    for key, ty in types.items():
        for r_kind in ty["readers"]:
            per = defaultdict(int)
            for d, p in enumerate(lay.producer):
                if p is not None and lay.kind[d] == key[0] and tasks[p].kind == key[1]:
                    for r in lay.readers[d]:
                        if tasks[r].kind == r_kind:
                            per[r] += 1
            if any(c != 1 for c in per.values()):
                ty["one_to_one"] = False
    return types, residence


def _longest_from(p: int, succ: list, seconds: list) -> dict:
    """Longest path (sum of ``seconds`` of its tasks, both ends included) from task p
    to every task reachable from it (tasks are in topological order)."""
    best = {p: seconds[p]}
    for t in range(p, len(seconds)):
        if t not in best:
            continue
        for s in succ[t]:
            cand = best[t] + seconds[s]
            if cand > best.get(s, -math.inf):
                best[s] = cand
    return best


def bound_of_trace(
    graph: TaskGraph,
    platform: Platform,
    trace: DynamicTrace,
    *,
    memory: dict | None = None,
    links: bool = True,
) -> SteadyBound:
    """:func:`training_lp` with a run's own durations: the mean of its tasks' compute
    seconds per (kind, device), of its recomputations per (producer kind, device), and
    each task's seconds for the lifetimes. The run's throughput never exceeds it."""
    lay = data_layout(graph)
    total, n = defaultdict(float), defaultdict(int)
    rtotal, rn = defaultdict(float), defaultdict(int)
    for t, task in enumerate(graph.tasks):
        u = trace.device[t]
        total[task.kind, u] += trace.duration[t]
        n[task.kind, u] += 1
        rebuilt = trace.rebuilt[t] if trace.rebuilt else ()
        for d in rebuilt:
            key = (graph.tasks[lay.producer[d]].kind, u)
            rtotal[key] += trace.recompute[t] / len(rebuilt)
            rn[key] += 1
    durations = {k: total[k] / n[k] for k in n}
    recompute = {k: rtotal[k] / rn[k] for k in rn}
    return training_lp(graph, platform, durations=durations, recompute=recompute,
                       task_seconds=list(trace.duration), memory=memory, links=links)  # fmt: skip
