"""Task graphs and the event loop in which dynamic policies place tasks at run time.

A :class:`TaskGraph` is a DAG of tasks, each with a kind (what runs: e.g. ``"F2"``,
the forward of pipeline group 2), a work in seconds at speed 1, and input edges that
carry bytes. :func:`simulate_dynamic` runs it on a Platform the way a StarPU-like
runtime does (Augonnet et al., "StarPU: a unified platform for task scheduling on
heterogeneous multicore architectures", CCPE 2011):

- when a task becomes ready, the policy's ``push(task, sim)`` returns a device (its
  queue), or None to leave it in a shared pool from which idle devices ``pull``;
- once a task has a device, the transfers of its inputs from their producers'
  devices start at once, each on its directed link, a serial resource (FIFO);
- every device runs its queue in order, one task at a time; the head waits for its
  inputs; its actual time is work / speed times the noise factor
  (:class:`schedir.pipeline.simulate.Noise`), and the policy hears ``complete``;
- a policy with ``static_lists`` (HEFT) fixes each device's whole order upfront.

Items (e.g. pipeline inputs) enter through a window: the tasks of item n are not
released before item n - ``window`` is complete (a bounded stream; None: all at once).
"""

from __future__ import annotations

import heapq
import itertools
import math
import numbers
from collections import deque
from dataclasses import dataclass, field

from schedir.errors import InvalidProblem
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.simulate import Noise, steady_period
from schedir.platform import Platform, check_bytes, check_number


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        name: display name, e.g. ``"F2[5]"``.
        kind: what it runs (the performance model's key), e.g. ``"F2"``.
        work: seconds at speed 1.
        deps: (producer task index, bytes of the edge) pairs.
        item: the stream item it belongs to (None: not part of a stream).
        final: whether its end completes its item.
    """

    name: str
    kind: str
    work: float
    deps: tuple[tuple[int, int], ...] = ()
    item: int | None = None
    final: bool = False

    def __post_init__(self) -> None:
        for field_name in ("name", "kind"):
            if not isinstance(getattr(self, field_name), str):
                raise InvalidProblem(f"task {field_name} = {getattr(self, field_name)!r}: "
                                     "expected a string")  # fmt: skip
        label = f"task {self.name!r}"
        object.__setattr__(self, "work", check_number(f"{label} work", self.work, what="time (s)"))
        try:
            deps = tuple((p, n) for p, n in self.deps)
        except (TypeError, ValueError):
            raise InvalidProblem(
                f"{label} deps = {self.deps!r}: expected (task, bytes) pairs"
            ) from None
        for p, n in deps:
            if isinstance(p, bool) or not isinstance(p, numbers.Integral):
                raise InvalidProblem(f"{label}: dep on {p!r}: expected a task index")
            check_bytes(f"{label}: bytes of its dep on {p}", n)
        object.__setattr__(self, "deps", tuple((int(p), int(n)) for p, n in deps))
        item = self.item
        if item is not None and (isinstance(item, bool) or not isinstance(item, numbers.Integral)):
            raise InvalidProblem(f"{label} item = {item!r}: expected an integer or None")
        if not isinstance(self.final, bool):
            raise InvalidProblem(f"{label} final = {self.final!r}: expected a bool")


@dataclass(frozen=True)
class TaskGraph:
    """Tasks in a topological order (every dep points to an earlier task)."""

    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        for t, task in enumerate(self.tasks):
            if not isinstance(task, Task):
                raise InvalidProblem(f"tasks[{t}] = {task!r}: expected a Task")
            for p, _ in task.deps:
                if not 0 <= p < t:
                    raise InvalidProblem(
                        f"task {task.name!r} (index {t}) depends on task {p}: deps must "
                        "point to earlier tasks (a topological order)"
                    )

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.tasks]
        for t, task in enumerate(self.tasks):
            for p, _ in task.deps:
                succ[p].append(t)
        return succ


def pipeline_graph(problem: PipelineProblem, items: int, cuts: tuple[int, ...] | None = None):
    """The task graph of ``items`` items (micro-batches) through the chain, one task
    per group of stages [cuts[g], cuts[g+1]) (default: one per stage). Inference:
    forwards ``F{g}`` chained by a_cut; training adds backwards ``B{g}`` that need d
    from the next group and the stash (sum of saved_size) of their own forward."""
    L, c = problem.length, problem.chain
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    tasks: list[Task] = []
    for n in range(items):
        f_ids = []
        for g in range(G):
            i, j = cuts[g], cuts[g + 1]
            deps = ((len(tasks) - 1, c.in_size[i]),) if g else ()
            w = sum(c.fwd_time[i:j])
            final = not problem.training and g == G - 1
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", w, deps, n, final))
            f_ids.append(len(tasks) - 1)
        if problem.training:
            for g in reversed(range(G)):
                i, j = cuts[g], cuts[g + 1]
                deps = [(f_ids[g], sum(c.saved_size[i:j]))]
                w = sum(c.bwd_time[i:j])
                if g < G - 1:
                    deps.append((len(tasks) - 1, c.in_size[j]))
                else:
                    w += c.fwd_time[L] + c.bwd_time[L]
                tasks.append(Task(f"B{g}[{n}]", f"B{g}", w, tuple(deps), n, g == 0))
    return TaskGraph(tuple(tasks))


@dataclass
class DynamicTrace:
    """What a dynamic run did.

    Attributes:
        makespan: end of the last task, seconds.
        period: steady-state seconds per item (sorted completions, second half).
        completion: completion time of each item, seconds (item order).
        device: device that ran each task.
        start, end: of each task, seconds.
        predicted_end: the policy's predicted end of each task when it was placed
            (None for policies without a model).
        transfers: (src, dst, bytes, start, end) of every transfer.
    """

    makespan: float
    period: float
    completion: list
    device: list
    start: list
    end: list
    predicted_end: list
    transfers: list = field(default_factory=list)


class DynamicSim:
    """The state a policy sees (read it; do not change it)."""

    def __init__(self, graph: TaskGraph, platform: Platform, noise: Noise):
        self.graph, self.platform = graph, platform
        self.names = [d.name for d in platform.devices]
        self.speed = {d.name: d.speed for d in platform.devices}
        self.links = {(lk.src, lk.dst): lk for lk in platform.links}
        self.now = 0.0
        n = len(graph.tasks)
        self.device: list = [None] * n
        self.start, self.end = [math.nan] * n, [math.nan] * n
        self.predicted_end: list = [None] * n
        self.queue = {u: deque() for u in self.names}
        self.running: dict = {u: None for u in self.names}
        self.link_free = {key: 0.0 for key in self.links}
        self.arrival = [0.0] * n
        self.noise, self.rng = noise, noise.generator()
        self.dev_factor = noise.device_factors(self.names)
        self.transfers: list = []

    def nominal(self, task: int, dev: str) -> float:
        """Seconds the profile predicts for ``task`` on ``dev``."""
        return self.graph.tasks[task].work / self.speed[dev]

    def transfer_time(self, src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        link = self.links.get((src, dst))
        if link is None:
            raise InvalidProblem(f"no link {src}->{dst}: dynamic runs need direct links")
        return link.time(nbytes)

    def data_ready_estimate(self, task: int, dev: str) -> float:
        """When the inputs of ``task`` would be on ``dev`` if sent now (link queues kept)."""
        ready, busy = self.now, dict(self.link_free)
        for p, nbytes in self.graph.tasks[task].deps:
            src = self.device[p]
            if src != dev:
                key = (src, dev)
                if key not in busy:
                    return math.inf
                t = max(self.now, busy[key]) + self.transfer_time(src, dev, nbytes)
                busy[key] = t
                ready = max(ready, t)
        return ready

    def queue_end(self, dev: str, predict) -> float:
        """Predicted time at which ``dev`` finishes what it holds (``predict(task, dev)``)."""
        t = self.now
        run = self.running[dev]
        if run is not None:
            t = max(t, self.start[run] + predict(run, dev))
        for q in self.queue[dev]:
            t = max(t, self.arrival[q]) + predict(q, dev)
        return t


def simulate_dynamic(
    graph: TaskGraph,
    platform: Platform,
    policy,
    *,
    noise: Noise | None = None,
    window: int | None = None,
) -> DynamicTrace:
    """Run ``graph`` under ``policy`` (see the module docstring); deterministic per seed."""
    sim = DynamicSim(graph, platform, noise or Noise())
    tasks, succ = graph.tasks, graph.successors()
    missing = [len(t.deps) for t in tasks]
    item_tasks: dict = {}
    for t, task in enumerate(tasks):
        item_tasks.setdefault(task.item, []).append(t)
    items = sorted(k for k in item_tasks if k is not None)
    released = set(item_tasks.get(None, []))
    gate = len(items) if window is None else window
    released.update(t for n in items[:gate] for t in item_tasks[n])
    next_item = min(gate, len(items))
    done_items: dict = {}
    events: list = []
    seq = itertools.count()
    pool: deque = deque()
    statics = getattr(policy, "static_lists", None)
    if statics:
        for u, lst in statics.items():
            for t in lst:
                sim.device[t] = u
            sim.queue[u].extend(lst)
    placed = set()

    def place(t: int, dev: str) -> None:
        sim.device[t] = dev
        arrive = sim.now
        for p, nbytes in tasks[t].deps:
            src = sim.device[p]
            if src != dev:
                key = (src, dev)
                if key not in sim.link_free:
                    raise InvalidProblem(f"no link {src}->{dev}: dynamic runs need direct links")
                s = max(sim.now, sim.link_free[key])
                e = s + sim.transfer_time(src, dev, nbytes)
                sim.link_free[key] = e
                sim.transfers.append((src, dev, nbytes, s, e))
                arrive = max(arrive, e)
        sim.arrival[t] = arrive
        placed.add(t)
        if arrive > sim.now:
            heapq.heappush(events, (arrive, next(seq), "wake", dev))

    def ready(t: int) -> None:
        if statics:
            place(t, sim.device[t])
            return
        dev = policy.push(t, sim)
        if dev is None:
            pool.append(t)
        else:
            sim.queue[dev].append(t)
            place(t, dev)

    def try_start(dev: str) -> None:
        if sim.running[dev] is not None:
            return
        if not sim.queue[dev] and pool:
            t = policy.pull(dev, pool, sim)
            if t is not None:
                pool.remove(t)
                sim.queue[dev].append(t)
                place(t, dev)
        if not sim.queue[dev]:
            return
        t = sim.queue[dev][0]
        if t not in placed or sim.arrival[t] > sim.now:
            return
        sim.queue[dev].popleft()
        sim.running[dev] = t
        sim.start[t] = sim.now
        f = sim.noise.factor(sim.rng) * sim.dev_factor[dev]
        heapq.heappush(events, (sim.now + sim.nominal(t, dev) * f, next(seq), "end", t))

    for t in sorted(released):
        if missing[t] == 0:
            ready(t)
    while True:
        for dev in sim.names:
            try_start(dev)
        if not events:
            break
        sim.now, _, kind, what = heapq.heappop(events)
        if kind != "end":
            continue
        t = what
        dev = sim.device[t]
        sim.end[t] = sim.now
        sim.running[dev] = None
        policy.complete(t, dev, sim.now - sim.start[t], sim)
        for s in succ[t]:
            missing[s] -= 1
        if tasks[t].final:
            done_items[tasks[t].item] = sim.now
            if next_item < len(items):
                n = items[next_item]
                next_item += 1
                for r in item_tasks[n]:
                    released.add(r)
                    if missing[r] == 0:
                        ready(r)
        for s in succ[t]:
            if missing[s] == 0 and s in released:
                ready(s)
    if any(math.isnan(e) for e in sim.end):
        stuck = [tasks[t].name for t in range(len(tasks)) if math.isnan(sim.end[t])][:5]
        raise InvalidProblem(f"dynamic run stalled; unfinished tasks: {stuck}")
    completion = [done_items[n] for n in sorted(done_items)]
    return DynamicTrace(
        makespan=max(sim.end, default=0.0),
        period=steady_period(completion),
        completion=completion,
        device=list(sim.device),
        start=list(sim.start),
        end=list(sim.end),
        predicted_end=list(sim.predicted_end),
        transfers=sim.transfers,
    )
