"""Static plans in the dynamic runtime: ``static`` runs one as is, ``guided`` follows
it while the measured times agree with it and re-plans when they drift.

A plan is a list of tasks per device (e.g. the 1F1B schedule of ``pipeline_1f1b``
turned into tasks by :func:`plan_from_schedule`, or HEFT's lists).

- ``static``: every device runs its list in order, waiting for its head's inputs
  (what a static schedule does at run time).
- ``guided`` (ours): the plan's placement and order, with two deviations.
  *Backfilling*: when a device's next planned task is not ready, it starts a later
  planned task that is ready, fits in its free memory without evicting, and is
  predicted to end before the head could start (its producers' predicted ends), so
  that noise turns into work done early rather than idle time, never (by the
  predictions) into a delay of the plan. *Re-planning*: the device's speed is
  measured (measured / profiled seconds of its tasks since the last plan); when
  it drifts from the plan's assumption by more than ``tol`` (after ``min_samples``
  tasks), the tasks not started yet are placed again by earliest-finish list
  scheduling with every device's measured speed, in the plan's order (its planned
  start times, which keeps, e.g., 1F1B's interleaving of forwards and backwards and
  so its memory), from the current state (where the data are, when devices free up).
"""

from __future__ import annotations

import math
from collections import defaultdict

from schedir.errors import InvalidProblem
from schedir.pipeline.dag import TaskGraph, simulate_dynamic
from schedir.pipeline.ops import Bwd, Fwd, PipelineSchedule
from schedir.platform import Platform
from solvers.pipeline.policies import Heft, list_schedule


def plan_from_schedule(graph: TaskGraph, schedule: PipelineSchedule) -> dict:
    """The tasks of a pipeline ``graph`` (with ``groups``) in the order of a training
    schedule's per-device ops: ``Fwd(i, j, n)`` is the forwards of the groups inside
    [i, j) on micro-batch n in order, ``Bwd`` their backwards in reverse order; the
    update ``W{g}`` goes last on the device that runs most of the group's backwards."""
    if not graph.groups:
        raise InvalidProblem("plan_from_schedule: the graph has no groups (stage ranges)")
    index = {(task.kind, task.item): t for t, task in enumerate(graph.tasks)}
    lists: dict = {}
    backwards: dict = defaultdict(lambda: defaultdict(int))
    for dev, ops in schedule.ops:
        lst = lists.setdefault(dev, [])
        for op in ops:
            if not isinstance(op, Fwd | Bwd):
                continue
            inside = [g for g, (a, b) in enumerate(graph.groups) if op.first <= a and b <= op.last]
            if sum(b - a for a, b in (graph.groups[g] for g in inside)) != op.last - op.first:
                raise InvalidProblem(f"{op} on {dev} does not cover whole groups of the graph "
                                     f"(groups {list(graph.groups)})")  # fmt: skip
            kind = "F" if isinstance(op, Fwd) else "B"
            for g in inside if kind == "F" else reversed(inside):
                t = index.get((f"{kind}{g}", op.mb))
                if t is None:
                    raise InvalidProblem(f"{op} on {dev}: the graph has no task {kind}{g}[{op.mb}]")
                lst.append(t)
                if kind == "B":
                    backwards[g][dev] += 1
    for g in range(len(graph.groups)):
        t = index.get((f"W{g}", None))
        if t is not None:
            devs = backwards[g]
            owner = max(devs, key=devs.get) if devs else next(iter(lists))
            lists[owner].append(t)
    _check_cover(graph, lists)
    return lists


def _check_cover(graph: TaskGraph, lists: dict) -> None:
    seen = [t for lst in lists.values() for t in lst]
    if sorted(seen) != list(range(len(graph.tasks))):
        missing = sorted(set(range(len(graph.tasks))) - set(seen))
        twice = sorted({t for t in seen if seen.count(t) > 1})
        names = [graph.tasks[t].name for t in (missing or twice)[:5]]
        what = "misses" if missing else "repeats"
        raise InvalidProblem(f"the plan {what} tasks {names}: a plan lists every task once")


def plan_lists(graph: TaskGraph, platform: Platform, plan) -> dict:
    """Device -> tasks from ``plan`` (lists, a PipelineSchedule, or None: HEFT's)."""
    if plan is None:
        return Heft(graph, platform).static_lists
    if isinstance(plan, PipelineSchedule):
        return plan_from_schedule(graph, plan)
    lists = {u: list(lst) for u, lst in dict(plan).items()}
    _check_cover(graph, lists)
    return lists


class Static:
    """Run a plan as is: each device its list, in order."""

    name = "static"
    strict = True

    def __init__(self, lists: dict):
        self.static_lists = {u: list(lst) for u, lst in lists.items()}

    def push(self, task, state):  # pragma: no cover - static lists are used instead
        raise AssertionError

    def complete(self, task, dev, seconds, state):
        pass


class Guided:
    """Follow a static plan, backfill, re-plan on drift (see the module docstring)."""

    name = "guided"

    def __init__(self, graph: TaskGraph, platform: Platform, lists: dict, *, tol: float = 0.15,
                 min_samples: int = 3, memory: dict | None = None):  # fmt: skip
        if not 0 < tol:
            raise ValueError(f"tol = {tol!r}: expected a positive fraction")
        self.graph, self.platform, self.tol, self.min_samples = graph, platform, tol, min_samples
        self.static_lists = {u: list(lst) for u, lst in lists.items()}
        for u in self.static_lists:
            platform.device(u)
        names = [d.name for d in platform.devices]
        self.speed = {d.name: d.speed for d in platform.devices}
        # the plan's start times (its order across devices), from a run at the profile's times
        self.planned = simulate_dynamic(graph, platform, Static(lists), memory=memory).start
        self.ratio = dict.fromkeys(names, 1.0)  # measured / profiled seconds, the plan's view
        self.measured = dict.fromkeys(names, 0.0)
        self.profiled = dict.fromkeys(names, 0.0)
        self.samples = dict.fromkeys(names, 0)
        self.replans = 0

    def predict(self, task: int, dev: str) -> float:
        return self.graph.tasks[task].work / self.speed[dev] * self.ratio[dev]

    def push(self, task, state):  # pragma: no cover - every task is placed upfront
        raise AssertionError

    def order(self, dev, tasks, state):
        q = state.queue[dev]
        if not q:
            return []
        head = q[0]
        if state.ready[head]:
            return [head]
        horizon = self._earliest_start(head, state)
        now = state.now
        return [t for t in tasks
                if now + self.predict(t, dev) <= horizon and state.fits(t, dev)]  # fmt: skip

    def _earliest_start(self, t: int, state) -> float:
        """When ``t``'s producers are predicted to end (inf if one has not started)."""
        when = state.now
        for p, _ in self.graph.tasks[t].deps:
            if state.done[p]:
                continue
            u = state.device[p]
            if state.running.get(u) == p:
                when = max(when, state.start[p] + self.predict(p, u))
            elif u is not None and state.busy[u] is not None and state.busy[u].task == p:
                when = max(when, state.now + self.predict(p, u))
            else:
                return math.inf
        return when

    def complete(self, task, dev, seconds, state):
        self.measured[dev] += seconds
        self.profiled[dev] += self.graph.tasks[task].work / self.speed[dev]
        self.samples[dev] += 1
        if self.samples[dev] < self.min_samples or self.profiled[dev] <= 0:
            return
        seen = self.measured[dev] / self.profiled[dev]
        if abs(seen / self.ratio[dev] - 1) > self.tol:
            self._replan(state)

    def _replan(self, state) -> None:
        for u in self.ratio:
            if self.samples[u] and self.profiled[u] > 0:
                self.ratio[u] = self.measured[u] / self.profiled[u]
            self.measured[u] = self.profiled[u] = 0.0
            self.samples[u] = 0
        started = {p.task for p in state.busy.values() if p is not None}
        left = [t for t in range(len(self.graph.tasks)) if not state.done[t] and t not in started]
        if not left:
            return
        finish, where = {}, {}
        avail = dict.fromkeys(state.names, state.now)
        for t in range(len(self.graph.tasks)):
            if state.done[t]:
                finish[t], where[t] = state.end[t], state.device[t]
        for u, plan in state.busy.items():
            if plan is not None:
                t = plan.task
                begun = state.start[t] if state.running[u] == t else state.now
                finish[t] = avail[u] = max(state.now, begun + self.predict(t, u))
                where[t] = u
        order = sorted(left, key=lambda t: (self.planned[t], t))
        lists, planned = list_schedule(self.graph, self.platform, order, self.predict,
                                       avail=avail, finish=finish, where=where)  # fmt: skip
        for u, lst in lists.items():
            for t in lst:
                self.planned[t] = planned[t] - self.predict(t, u)
        state.assign(lists)
        self.replans += 1
