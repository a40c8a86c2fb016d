"""Static plans in the dynamic runtime: ``static`` runs one as is, ``guided`` follows
it while the measured times agree with it and re-plans when they drift.

A plan is a list of tasks per device (e.g. the 1F1B schedule of ``pipeline_1f1b``
turned into tasks by :func:`plan_from_schedule`, or HEFT's lists).

- ``static``: every device runs its list in order, waiting for its head's inputs
  (what a static schedule does at run time).
- ``guided`` (ours): given one plan or several (it keeps the one that ends first at
  the profile's times), the plan's placement and order, with two deviations.
  *Backfilling*: when a device's next planned task is not ready, it starts a later
  planned task that is ready, fits in its free memory without evicting, and is
  predicted to end before the head could start (a lower bound of its producers' ends
  by the predictions, through the producers not started yet), so
  that noise turns into work done early rather than idle time, never (by the
  predictions) into a delay of the plan. *Re-planning*: each device's speed is
  measured (measured / profiled seconds of its tasks so far); when the estimate
  differs from the plan's assumption by more than ``tol`` and by more than ``z``
  standard errors of the per-task ratios (after ``min_samples`` tasks: per-task noise
  alone does not trigger it, a device persistently slower or faster does), the tasks
  not started yet are placed again by earliest-finish list scheduling with every
  device's estimated speed, in the plan's order (its planned start times, which
  keeps, e.g., 1F1B's interleaving of forwards and backwards and so its memory), from
  the current state (where data are, when devices free up); a backward whose stash
  already exists stays with it.
"""

from __future__ import annotations

import math
from collections import defaultdict

from schedir.dynamic import TaskGraph, simulate_dynamic
from schedir.errors import InvalidProblem
from schedir.pipeline.ops import Bwd, Fwd
from schedir.pipeline.schedule import PipelineSchedule
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
    if isinstance(plan, str) and plan == "heft":
        plan = None
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

    def __init__(self, graph: TaskGraph, platform: Platform, plans, *, tol: float = 0.15,
                 z: float = 4.0, min_samples: int = 16, memory: dict | None = None):  # fmt: skip
        if not 0 < tol:
            raise ValueError(f"tol = {tol!r}: expected a positive fraction")
        self.graph, self.platform = graph, platform
        self.tol, self.z, self.min_samples = tol, z, min_samples
        plans = [plans] if isinstance(plans, dict) else list(plans)
        if not plans:
            raise ValueError("guided: no plan to follow")
        best = None
        for lists in plans:
            # the plan's start times (its order across devices) at the profile's times
            run = simulate_dynamic(graph, platform, Static(lists), memory=memory)
            if best is None or run.makespan < best[0]:
                best = (run.makespan, lists, run.start)
        _, lists, self.planned = best
        self.static_lists = {u: list(lst) for u, lst in lists.items()}
        names = [d.name for d in platform.devices]
        self.speed = {d.name: d.speed for d in platform.devices}
        self.ratio = dict.fromkeys(names, 1.0)  # measured / profiled seconds, the plan's view
        self.ratios: dict = {u: [] for u in names}
        self.replans = 0
        self.samples, self.next_check = 0, 0
        lay_stash = {d for d, datum in enumerate(graph.data) if datum.kind == "stash"}
        self.stash_of = {t: [p for p, _ in task.deps
                             if any(d in lay_stash for d in graph.tasks[p].writes
                                    if d in task.reads)]
                         for t, task in enumerate(graph.tasks)}  # fmt: skip

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
        """A lower bound of when ``t``'s producers end, by the predictions: a producer
        not started yet ends at least its own time after its producers' bound."""
        memo: dict = {}

        def end(p: int) -> float:
            if p in memo:
                return memo[p]
            if state.done[p]:
                got = state.end[p]
            else:
                u = state.device[p]
                took = self.predict(p, u) if u is not None else min(
                    self.predict(p, v) for v in state.names)  # fmt: skip
                if u is not None and state.running.get(u) == p:
                    got = state.start[p] + took
                else:
                    deps = [end(q) for q, _ in self.graph.tasks[p].deps]
                    got = max([state.now, *deps]) + took
            memo[p] = got
            return got

        return max([state.now] + [end(p) for p, _ in self.graph.tasks[t].deps])

    def complete(self, task, dev, seconds, state):
        profiled = self.graph.tasks[task].work / self.speed[dev]
        if profiled <= 0:
            return
        self.ratios[dev].append(seconds / profiled)
        self.samples += 1
        if self.samples >= self.next_check and self._drifted(dev):
            self.next_check = self.samples + self.min_samples  # one attempt per window
            self._replan(state)

    def _estimate(self, dev: str) -> tuple[float, float]:
        """(mean, standard error) of the device's measured / profiled ratios."""
        rs = self.ratios[dev]
        n = len(rs)
        mean = sum(rs) / n
        sd = math.sqrt(sum((r - mean) ** 2 for r in rs) / (n - 1)) if n > 1 else math.inf
        return mean, sd / math.sqrt(n)

    def _drifted(self, dev: str) -> bool:
        if len(self.ratios[dev]) < self.min_samples:
            return False
        est, err = self._estimate(dev)
        gap = abs(est - self.ratio[dev])
        return gap > self.tol * self.ratio[dev] and gap > self.z * err

    def _replan(self, state) -> None:
        before = dict(self.ratio)
        for u in self.ratio:
            if len(self.ratios[u]) >= 2:
                self.ratio[u] = self._estimate(u)[0]
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
        pin = {t: where[p] for t in left for p in self.stash_of[t] if p in where}
        order = sorted(left, key=lambda t: (self.planned[t], t))
        args = {"avail": avail, "finish": finish, "where": where}
        lists, planned = list_schedule(self.graph, self.platform, order, self.predict,
                                       pin=pin, **args)  # fmt: skip
        # the current plan at the new speeds: the same order, every task where it is
        stay = {t: state.device[t] for t in left}
        _, kept = list_schedule(self.graph, self.platform, order, self.predict, pin=stay, **args)
        if max(planned[t] for t in left) > (1 - self.tol / 2) * max(kept[t] for t in left):
            self.ratio = before  # not worth moving: the plan stands, drift is checked again
            return
        for u, lst in lists.items():
            for t in lst:
                self.planned[t] = planned[t] - self.predict(t, u)
        state.assign(lists)
        self.replans += 1
