"""Dynamic policies ``"eager"``, ``"dmda"`` and the static list scheduler ``"heft"``.

They run in the event loop of :mod:`schedir.pipeline_dag` (a StarPU-like runtime):

- ``eager``: one shared queue; an idle device takes the oldest ready task (StarPU's
  ``eager``). No performance model.
- ``dmda`` (deque model, data aware; Augonnet et al., CCPE 2011): when a task becomes
  ready it goes to the device u minimizing its predicted end
  ``max(queue end of u, now + transfer time of its inputs to u) + predicted time on u``.
  Predictions come from a :class:`HistoryModel`: per (task kind, device), the mean of
  the measured durations so far, the profile's ``work / speed`` before any.
- ``heft`` (Topcuoglu, Hariri and Wu, IEEE TPDS 2002): tasks by decreasing upward rank
  (mean time + heaviest path of mean compute and communication to an exit), each to
  the device of earliest finish (no insertion); the per-device orders are then fixed
  and executed as such, whatever the actual times.
"""

from __future__ import annotations

import math
from collections import defaultdict

from schedir.pipeline.dag import DynamicTrace, TaskGraph, pipeline_graph, simulate_dynamic
from schedir.pipeline.model import capacity
from schedir.pipeline.ops import Fwd, PipelineSchedule, Recv, Send
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.simulate import Noise, simulate_pipeline
from schedir.platform import Platform
from solvers.registry import Infeasible, register


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
    """Shared FIFO queue; idle devices pull."""

    name = "eager"

    def __init__(self, graph: TaskGraph, platform: Platform):
        self.graph = graph

    def push(self, task, sim):
        return None

    def pull(self, dev, pool, sim):
        return pool[0] if pool else None

    def complete(self, task, dev, seconds, sim):
        pass


class Dmda:
    """StarPU's dmda with a history-based model (see the module docstring)."""

    name = "dmda"

    def __init__(self, graph: TaskGraph, platform: Platform, model: HistoryModel | None = None):
        self.model = model or HistoryModel(graph, {d.name: d.speed for d in platform.devices})

    def push(self, task, sim):
        best, best_end = None, math.inf
        for dev in sim.names:
            end = max(sim.queue_end(dev, self.model.predict), sim.data_ready_estimate(task, dev))
            end += self.model.predict(task, dev)
            if end < best_end - 1e-15:
                best, best_end = dev, end
        sim.predicted_end[task] = best_end
        return best

    def pull(self, dev, pool, sim):  # never used: dmda always pushes
        return None

    def complete(self, task, dev, seconds, sim):
        self.model.record(task, dev, seconds)


class Heft:
    """HEFT's static lists (computed from the profile's times at construction)."""

    name = "heft"

    def __init__(self, graph: TaskGraph, platform: Platform):
        devs = platform.devices
        links = platform.links
        inv = sum(1 / d.speed for d in devs) / len(devs)
        # mean seconds per byte over the links (0 for infinite bandwidths, none: free)
        per_byte = [1 / lk.bandwidth if lk.bandwidth > 0 else math.inf for lk in links]
        mean_per_byte = sum(per_byte) / len(per_byte) if per_byte else 0.0
        mean_lat = sum(lk.latency for lk in links) / len(links) if links else 0.0

        def mean_comm(nbytes: int) -> float:
            return mean_lat + (nbytes * mean_per_byte if nbytes else 0.0)

        tasks, succ = graph.tasks, graph.successors()
        out_bytes = defaultdict(dict)
        for t, task in enumerate(tasks):
            for p, nbytes in task.deps:
                out_bytes[p][t] = nbytes
        rank = [0.0] * len(tasks)
        for t in reversed(range(len(tasks))):
            tail = max((mean_comm(out_bytes[t][s]) + rank[s] for s in succ[t]), default=0.0)
            rank[t] = tasks[t].work * inv + tail
        order = sorted(range(len(tasks)), key=lambda t: (-rank[t], t))
        avail = {d.name: 0.0 for d in devs}
        finish, where = [0.0] * len(tasks), [None] * len(tasks)
        lk = {(x.src, x.dst): x for x in links}
        self.static_lists: dict = {d.name: [] for d in devs}
        for t in order:
            best = (math.inf, None)
            for d in devs:
                ready = 0.0
                for p, nbytes in tasks[t].deps:
                    if where[p] == d.name:
                        ready = max(ready, finish[p])
                    elif (where[p], d.name) in lk:
                        ready = max(ready, finish[p] + lk[where[p], d.name].time(nbytes))
                    else:
                        ready = math.inf
                eft = max(avail[d.name], ready) + tasks[t].work / d.speed
                if eft < best[0] - 1e-15:
                    best = (eft, d.name)
            finish[t], where[t] = best
            avail[best[1]] = best[0]
            self.static_lists[best[1]].append(t)
        self.planned_finish = finish

    def push(self, task, sim):  # pragma: no cover - static lists are used instead
        raise AssertionError

    def pull(self, dev, pool, sim):  # pragma: no cover
        return None

    def complete(self, task, dev, seconds, sim):
        pass


POLICIES = {"eager": Eager, "dmda": Dmda, "heft": Heft}


def run_policy(
    graph: TaskGraph,
    platform: Platform,
    policy: str,
    *,
    noise: Noise | None = None,
    window: int | None = None,
) -> DynamicTrace:
    """Run ``graph`` on ``platform`` under the named policy."""
    return simulate_dynamic(
        graph, platform, POLICIES[policy](graph, platform), noise=noise, window=window
    )


def realized_schedule(problem: PipelineProblem, graph: TaskGraph, trace: DynamicTrace, cuts):
    """The placement and order a run realized, as per-device op lists (inference)."""
    per_dev: dict = defaultdict(list)
    succ = graph.successors()
    index = {}
    for t, task in enumerate(graph.tasks):
        g = int(task.kind[1:])
        index[t] = (g, task.item)
    for t in sorted(range(len(graph.tasks)), key=lambda t: (trace.start[t], t)):
        g, n = index[t]
        dev = trace.device[t]
        for p, _ in graph.tasks[t].deps:
            if trace.device[p] != dev:
                per_dev[dev].append(Recv("a", cuts[g], n, trace.device[p]))
        per_dev[dev].append(Fwd(cuts[g], cuts[g + 1], n))
        for s in succ[t]:
            if trace.device[s] != dev:
                per_dev[dev].append(Send("a", cuts[g + 1], n, trace.device[s]))
    return tuple((u, tuple(ops)) for u, ops in per_dev.items())


def _check_memory(problem: PipelineProblem, schedule: PipelineSchedule, budget, policy) -> None:
    """Infeasible when the replayed run holds more than a device may (the policies place
    tasks by time only and do not plan memory)."""
    trace = simulate_pipeline(problem, schedule)
    for dev, peak in trace.device_peak.items():
        cap = capacity(problem, dev, budget)
        if cap is not None and peak > cap:
            raise Infeasible(policy, budget, None, f"the run holds {peak} bytes on {dev}, which "
                             f"may hold {cap}; {policy} does not plan memory")  # fmt: skip


def _registered(policy: str):
    def solve(
        problem: PipelineProblem,
        budget: int | None = None,
        *,
        items: int = 64,
        cuts: tuple[int, ...] | None = None,
        noise_sigma: float = 0.0,
        seed: int = 0,
        window: int | None = None,
    ) -> PipelineSchedule:
        if problem.training:
            raise NotImplementedError(
                f"{policy} through the registry is for inference; for training use "
                "solvers.pipeline.dynamic.run_policy(pipeline_graph(problem, ...), ...)"
            )
        cuts = tuple(cuts or range(problem.length + 1))
        graph = pipeline_graph(problem, items, cuts)
        trace = run_policy(graph, problem.platform, policy,
                           noise=Noise(noise_sigma, seed), window=window)  # fmt: skip
        meta = {
            "method": policy,
            "kind": "inference",
            "items": items,
            "dynamic_period": trace.period,
            "dynamic_makespan": trace.makespan,
            "throughput": items / trace.makespan if trace.makespan > 0 else None,
            "exact": False,
        }
        schedule = PipelineSchedule(realized_schedule(problem, graph, trace, cuts), meta)
        _check_memory(problem, schedule, budget, policy)
        return schedule

    solve.__name__ = policy
    solve.__doc__ = f"Run the pipeline's task graph under {policy}; ops = realized placement."
    return solve


for _name, _desc in (
    ("eager", "dynamic: shared queue, idle devices pull (StarPU eager)"),
    ("dmda", "dynamic: earliest predicted end with transfers, history model (StarPU dmda)"),
    ("heft", "static list scheduling by upward rank and earliest finish (HEFT)"),
):
    register(_name, problem=PipelineProblem, exact=False, description=_desc)(_registered(_name))
