"""The dynamic policies and the list scheduler they share (see
:mod:`solvers.pipeline.dynamic` for what each does; ``static`` and ``guided`` are in
:mod:`solvers.pipeline.guided`)."""

from __future__ import annotations

import math
from collections import defaultdict

from schedir.dynamic import TaskGraph
from schedir.platform import Platform


class HistoryModel:
    """History-based performance model: mean measured seconds per (kind, device)."""

    def __init__(self, graph: TaskGraph, speeds: dict[str, float]):
        self.graph, self.speeds = graph, speeds
        self.total: dict = defaultdict(float)
        self.count: dict = defaultdict(int)

    def predict(self, task: int, dev: str) -> float:
        key = (self.graph.tasks[task].kind, dev)
        if self.count[key]:
            return self.total[key] / self.count[key]
        return self.graph.tasks[task].work / self.speeds[dev]

    def record(self, task: int, dev: str, seconds: float) -> None:
        key = (self.graph.tasks[task].kind, dev)
        self.total[key] += seconds
        self.count[key] += 1


class Eager:
    """Shared FIFO pool; idle devices take the oldest ready task that fits."""

    name = "eager"

    def __init__(self, graph: TaskGraph, platform: Platform):
        self.graph = graph

    def push(self, task, state):
        return None

    def complete(self, task, dev, seconds, state):
        pass


class Dmda:
    """StarPU's dmda with a history-based model (see the module docstring)."""

    name = "dmda"

    def __init__(self, graph: TaskGraph, platform: Platform, model: HistoryModel | None = None):
        self.model = model or HistoryModel(graph, {d.name: d.speed for d in platform.devices})

    def push(self, task, state):
        predict = self.model.predict
        best, best_end = None, math.inf
        for dev in state.names:
            end = max(state.queue_end(dev, predict), state.data_ready_estimate(task, dev))
            end += predict(task, dev) + state.memory_delay(task, dev)
            if end < best_end - 1e-15:
                best, best_end = dev, end
        if best is None:  # fits nowhere: the device that holds the most (the run reports it)
            best = max(state.names, key=lambda u: _capacity(state, u))
        state.record_prediction(task, best_end)
        return best

    def complete(self, task, dev, seconds, state):
        self.model.record(task, dev, seconds)


def _capacity(state, u: str) -> float:
    return math.inf if state.cap[u] is None else state.cap[u]


class Dmdas(Dmda):
    """dmda's placement; queues run by decreasing upward rank (StarPU's dmdas)."""

    name = "dmdas"

    def __init__(self, graph: TaskGraph, platform: Platform, model: HistoryModel | None = None):
        super().__init__(graph, platform, model)
        self.rank = upward_rank(graph, platform)

    def order(self, dev, tasks, state):
        return sorted(tasks, key=lambda t: (-self.rank[t], t))


def mean_comm(platform: Platform):
    """``nbytes -> seconds`` over a mean link (mean latency, mean seconds per byte)."""
    links = platform.links
    per_byte = [1 / lk.bandwidth if lk.bandwidth > 0 else math.inf for lk in links]
    mean_per_byte = sum(per_byte) / len(per_byte) if per_byte else 0.0
    mean_lat = sum(lk.latency for lk in links) / len(links) if links else 0.0
    return lambda nbytes: mean_lat + (nbytes * mean_per_byte if nbytes else 0.0)


def upward_rank(graph: TaskGraph, platform: Platform) -> list[float]:
    """HEFT's upward rank of every task: its mean time over the devices plus the
    heaviest path of mean compute and mean communication to an exit."""
    devs = platform.devices
    inv = sum(1 / d.speed for d in devs) / len(devs)
    comm = mean_comm(platform)
    tasks, succ = graph.tasks, graph.successors()
    out_bytes: dict = defaultdict(dict)
    for t, task in enumerate(tasks):
        for p, nbytes in task.deps:
            out_bytes[p][t] = max(out_bytes[p].get(t, 0), nbytes)
    rank = [0.0] * len(tasks)
    for t in reversed(range(len(tasks))):
        tail = max((comm(out_bytes[t][s]) + rank[s] for s in succ[t]), default=0.0)
        rank[t] = tasks[t].work * inv + tail
    return rank


def list_schedule(
    graph: TaskGraph,
    platform: Platform,
    order,
    predict,
    *,
    avail: dict | None = None,
    finish: dict | None = None,
    where: dict | None = None,
    pin: dict | None = None,
) -> tuple[dict, dict]:
    """Earliest-finish list scheduling (no insertion) of the tasks of ``order``, in
    that order: each to the device where ``predict(task, device)`` after its inputs
    (its producers' ``finish`` plus their link time) and the device's ``avail`` ends
    first (``pin``: task -> the only device it may take). ``finish`` / ``where`` give
    the end and device of tasks already placed. Returns (device -> tasks in order,
    task -> planned finish)."""
    names = [d.name for d in platform.devices]
    avail = dict(avail or dict.fromkeys(names, 0.0))
    finish, where = dict(finish or {}), dict(where or {})
    lk = {(x.src, x.dst): x for x in platform.links}
    lists: dict = {u: [] for u in names}
    tasks = graph.tasks
    pin = pin or {}
    for t in order:
        best = (math.inf, None)
        for u in [pin[t]] if t in pin else names:
            ready = 0.0
            for p, nbytes in tasks[t].deps:
                if where[p] == u:
                    ready = max(ready, finish[p])
                elif (where[p], u) in lk:
                    ready = max(ready, finish[p] + lk[where[p], u].time(nbytes))
                else:
                    ready = math.inf
            eft = max(avail[u], ready) + predict(t, u)
            if eft < best[0] - 1e-15:
                best = (eft, u)
        if best[1] is None:
            best = (math.inf, names[0])
        finish[t], where[t] = best
        avail[best[1]] = best[0]
        lists[best[1]].append(t)
    return lists, finish


class Heft:
    """HEFT's static lists (computed from the profile's times at construction)."""

    name = "heft"
    strict = True

    def __init__(self, graph: TaskGraph, platform: Platform):
        rank = upward_rank(graph, platform)
        order = sorted(range(len(graph.tasks)), key=lambda t: (-rank[t], t))
        speed = {d.name: d.speed for d in platform.devices}
        self.static_lists, self.planned_finish = list_schedule(
            graph, platform, order, lambda t, u: graph.tasks[t].work / speed[u]
        )

    def push(self, task, state):  # pragma: no cover - static lists are used instead
        raise AssertionError

    def complete(self, task, dev, seconds, state):
        pass
