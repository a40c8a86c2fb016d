"""The state of one dynamic run: the one interface its executors and its policy use.

:class:`RuntimeState` is driven by the simulator (:func:`schedir.dynamic.simulate_dynamic`)
and by the JAX runtime (``jax_exec.pipeline.dynamic``); each executor adds its clock and
carries out what the state decides, through these calls only:

- ``start_run()``; then, whenever a device is ``idle(u)``, ``next_plan(u)``: the
  :class:`~.admission.TaskPlan` it carries out (None: it waits);
- ``offloaded(d, u)`` when an offload the plan asked for ended, ``begin(plan)`` once
  they all did, ``arrived(d, u, src)`` when a move ended, ``started(t)`` when the
  task's inputs are there and it starts computing, ``finished(t, seconds,
  recompute_seconds)`` when it ends;
- ``take_transfers()``: the moves started on placement (prefetch), to carry out;
  ``take_freed()``: the copies freed, to drop; ``present(d, u)``: whether a copy is
  there; ``stalled``: nothing runs and tasks are left;
- an executor that simulates time books the links with ``book_transfer`` and
  ``book_offload`` (FIFO per directed link) and reads ``recompute_work(plan)``;
- ``check_done()`` and ``trace()`` at the end.

The rules live one per module: placement, the items' window and the queues here;
admission (:mod:`.admission`), eviction (:mod:`.eviction`) and transfers
(:mod:`.transfers`) over the data's bookkeeping and the freeing rule
(:mod:`.residency`); docs/dynamic_training.md states them all.

A policy (``solvers.pipeline.dynamic``) reads the state and answers three questions:
``push(task, state)`` -> the device whose queue a ready task joins (None: a shared
pool), ``order(device, tasks, state)`` -> the order in which an idle device would
start the candidates (default: as given), ``complete(task, device, seconds, state)``
-> what it learns. ``static_lists`` (device -> tasks) fixes placements upfront;
``strict`` makes a device run its queue in order.

**Placement.** A ready task goes to the device the policy names (with ``prefetch``,
its missing inputs start moving at once if they fit there). An idle device considers
its ready queued tasks (strict: its head; an empty queue: the pool) in the policy's
order (:mod:`.admission` says which it starts).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from schedir.dynamic.dataflow import HOST, data_layout
from schedir.dynamic.runtime.admission import Admission, TaskPlan
from schedir.dynamic.runtime.eviction import Eviction
from schedir.dynamic.runtime.residency import Residency
from schedir.dynamic.runtime.transfers import Transfers
from schedir.dynamic.trace import DynamicTrace
from schedir.errors import InvalidProblem
from schedir.pipeline.simulate import steady_period
from schedir.platform import Platform


class RuntimeState:
    """The state of one dynamic run (see the module docstring).

    Read by policies: ``names``, ``speed``, ``cap``, ``now``, ``graph``, ``platform``,
    ``layout`` (the graph's data, :class:`~schedir.dynamic.dataflow.DataLayout`);
    per task ``device``, ``start``, ``end``, ``ready``, ``done``; per device
    ``queue``, ``pool`` (ready tasks placed nowhere), ``running`` (the task computing
    there), ``busy`` (the plan it carries out); ``nominal``, ``transfer_time``,
    ``data_ready_estimate``, ``queue_end``, ``fits``, ``memory_delay``. Written by
    policies through ``record_prediction`` (a task's predicted end when placed) and
    ``assign`` (the queues of tasks not started yet).
    """

    def __init__(
        self,
        graph,
        platform: Platform,
        policy,
        *,
        clock: Callable[[], float],
        window: int | None = None,
        memory: dict | None = None,
        prefetch: bool = True,
    ):
        self.graph, self.platform, self.policy, self._clock = graph, platform, policy, clock
        self.names = [d.name for d in platform.devices]
        if HOST in self.names:
            raise InvalidProblem(f"device name {HOST!r} is reserved for the host")
        self.speed = {d.name: d.speed for d in platform.devices}
        self.cap = {d.name: d.memory for d in platform.devices}
        for u, cap in (memory or {}).items():
            if u not in self.cap:
                raise InvalidProblem(f"memory: unknown device {u!r}; known: {self.names}")
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
                raise InvalidProblem(f"memory[{u!r}] = {cap!r}: expected bytes (an integer >= 0)")
            self.cap[u] = cap
        tasks = graph.tasks
        n = len(tasks)
        self.device: list = [None] * n
        self.start, self.end = [math.nan] * n, [math.nan] * n
        self.duration, self.recompute = [math.nan] * n, [0.0] * n
        self.rebuilt: list = [()] * n
        self.predicted_end: list = [None] * n
        self.queue = {u: deque() for u in self.names}
        self.pool: deque = deque()
        self.busy: dict = dict.fromkeys(self.names)  # the plan a device carries out
        self.running: dict = dict.fromkeys(self.names)  # the task computing there
        self.done = [False] * n
        self.ready = [False] * n
        self.missing = [len({p for p, _ in t.deps}) for t in tasks]
        self.succ = graph.successors()
        self.layout = data_layout(graph)
        self._memory = Residency(self.layout, self.cap, clock)
        self._transfers = Transfers(platform, self.layout, self._memory, self.nominal, clock,
                                    prefetch)  # fmt: skip
        self._eviction = Eviction(self.layout, self._memory, self._transfers, self.done, clock)
        self._admission = Admission(tasks, self.layout, self._memory, self._transfers,
                                    self._eviction)  # fmt: skip
        self.strict = bool(getattr(policy, "strict", False))
        self._order = getattr(policy, "order", None)
        # items and their window
        self.item_tasks: dict = {}
        for t, task in enumerate(tasks):
            self.item_tasks.setdefault(task.item, []).append(t)
        self.items = sorted(k for k in self.item_tasks if k is not None)
        self.released = set(self.item_tasks.get(None, []))
        gate = len(self.items) if window is None else window
        self.released.update(t for k in self.items[:gate] for t in self.item_tasks[k])
        self.next_item = min(gate, len(self.items))
        self.done_items: dict = {}
        for u, lst in (getattr(policy, "static_lists", None) or {}).items():
            self._check_device(u)
            for t in lst:
                self.device[t] = u
            self.queue[u].extend(lst)

    # ---- what policies read -------------------------------------------------------
    @property
    def now(self) -> float:
        return self._clock()

    def nominal(self, task: int, dev: str) -> float:
        """Seconds the profile predicts for ``task`` on ``dev``."""
        return self.graph.tasks[task].work / self.speed[dev]

    def transfer_time(self, src: str, dst: str, nbytes: int) -> float:
        """Seconds to move ``nbytes`` from ``src`` to ``dst`` (inf without a link; see
        :meth:`.transfers.Transfers.time`)."""
        return self._transfers.time(src, dst, nbytes)

    def data_ready_estimate(self, task: int, dev: str) -> float:
        """When the inputs of ``task`` would be on ``dev`` if sent now (link queues kept)."""
        return self._transfers.ready_estimate(task, dev)

    def queue_end(self, dev: str, predict) -> float:
        """Predicted time at which ``dev`` finishes what it holds (``predict(task, dev)``)."""
        t = self.now
        plan = self.busy[dev]
        if plan is not None:
            r = plan.task
            begun = self.start[r] if self.running[dev] == r else t
            t = max(t, begun + predict(r, dev))
        for q in self.queue[dev]:
            t = max(t, self._transfers.arrival(q, dev)) + predict(q, dev)
        return t

    def fits(self, task: int, dev: str) -> bool:
        """Whether ``task`` would fit on ``dev`` now without evicting anything."""
        return self._admission.fits(task, dev)

    def memory_delay(self, task: int, dev: str) -> float:
        """Seconds ``dev`` would spend making room for ``task`` now (see
        :meth:`.admission.Admission.memory_delay`)."""
        return self._admission.memory_delay(task, dev)

    # ---- what policies write ------------------------------------------------------
    def record_prediction(self, task: int, end: float) -> None:
        """The policy's predicted end of ``task`` when it placed it (reported)."""
        self.predicted_end[task] = end

    def assign(self, lists: dict) -> None:
        """Re-place tasks not admitted yet: device -> tasks in queue order."""
        moved = {t for lst in lists.values() for t in lst}
        for t in moved:
            if self.done[t] or any(p is not None and p.task == t for p in self.busy.values()):
                raise InvalidProblem(f"assign: task {self.graph.tasks[t].name!r} has started")
        self.pool = deque(t for t in self.pool if t not in moved)
        for u in self.names:
            self.queue[u] = deque(t for t in self.queue[u] if t not in moved)
        for u, lst in lists.items():
            self._check_device(u)
            for t in lst:
                self.device[t] = u
                self.queue[u].append(t)
                if self.ready[t]:
                    self._transfers.prefetch(t, u)

    # ---- placement ----------------------------------------------------------------
    def start_run(self) -> None:
        """Make the first tasks ready (the policy places them)."""
        for t in sorted(self.released):
            if self.missing[t] == 0:
                self._ready(t)

    def _check_device(self, u) -> None:
        if u not in self.queue:
            raise InvalidProblem(f"policy placed a task on unknown device {u!r}; "
                                 f"known: {self.names}")  # fmt: skip

    def _ready(self, t: int) -> None:
        self.ready[t] = True
        if self.device[t] is not None:  # placed upfront (static lists)
            self._transfers.prefetch(t, self.device[t])
            return
        dev = self.policy.push(t, self)
        if dev is None:
            self.pool.append(t)
            return
        self._check_device(dev)
        self.device[t] = dev
        self.queue[dev].append(t)
        self._transfers.prefetch(t, dev)

    # ---- what executors call --------------------------------------------------------
    def idle(self, u: str) -> bool:
        """Whether device ``u`` carries out no plan."""
        return self.busy[u] is None

    @property
    def stalled(self) -> bool:
        """Nothing runs anywhere and tasks are left (:meth:`check_done` says why)."""
        return all(p is None for p in self.busy.values()) and not all(self.done)

    @property
    def finished_all(self) -> bool:
        """Every task ran."""
        return all(self.done)

    def present(self, d: int, u: str) -> bool:
        """Whether datum ``d`` is on device ``u`` (not only arriving)."""
        return self._memory.state(d, u) == "present"

    def take_transfers(self) -> list:
        """Transfers the state started on placement since the last call: (datum, src, dst)."""
        return self._transfers.take_started()

    def take_freed(self) -> list:
        """Copies freed since the last call: (datum, device or ``HOST``)."""
        return self._memory.take_freed()

    def book_transfer(self, d: int, src: str, dst: str) -> float:
        """Time a move of ``d`` on its link from now (FIFO); returns its end."""
        return self._transfers.book(d, src, dst)

    def book_offload(self, d: int, u: str) -> float:
        """Time the offload of ``d`` from ``u`` on its host link; returns its end."""
        return self._transfers.book_offload(d, u)

    def recompute_work(self, plan: TaskPlan) -> float:
        """The profile's seconds of the recomputations ``plan`` runs first."""
        return sum(self.nominal(self.layout.producer[d], plan.device) for d in plan.recompute)

    def next_plan(self, u: str) -> TaskPlan | None:
        """What idle device ``u`` does next (see :mod:`.admission`), or None: wait."""
        if self.busy[u] is not None:
            return None
        cands = self._candidates(u)

        def others() -> list[int]:  # the other ready tasks placed here, in queue order
            return [t for t in self.queue[u] if self.ready[t] and t not in cands]

        plan = self._admission.select(u, cands, others)
        if plan is None:
            return None
        t = plan.task
        if self.device[t] == u and t in self.queue[u]:
            self.queue[u].remove(t)
        else:
            self.pool.remove(t)
        self.device[t] = u
        self.busy[u] = plan
        self._admission.commit(plan)
        return plan

    def _candidates(self, u: str) -> list[int]:
        q = self.queue[u]
        if self.strict:
            return [q[0]] if q and self.ready[q[0]] else []
        cands = [t for t in q if self.ready[t]]
        if not cands and not q:
            cands = list(self.pool)
        if cands and self._order is not None:
            cands = list(self._order(u, cands, self))
        return cands

    def offloaded(self, d: int, u: str) -> None:
        """The offload of ``d`` from ``u`` ended: it is on the host now."""
        self._eviction.offloaded(d, u)

    def begin(self, plan: TaskPlan) -> None:
        """The plan's evictions are done: allocate what it adds and start its fetches."""
        self._admission.begin(plan, self.now)

    def arrived(self, d: int, u: str, src: str) -> None:
        """A transfer of ``d`` from ``src`` to ``u`` ended."""
        self._transfers.arrived(d, u, src, self.now)

    def started(self, t: int) -> None:
        """``t`` starts computing (its inputs are on its device)."""
        u = self.device[t]
        self.running[u] = t
        self.start[t] = self.now

    def finished(self, t: int, seconds: float, recompute_seconds: float = 0.0) -> None:
        """``t`` ended after ``seconds`` of compute and ``recompute_seconds`` rebuilding
        dropped inputs: free what it no longer needs, release its successors."""
        u = self.device[t]
        now = self.now
        plan = self.busy[u]
        self.end[t], self.duration[t], self.recompute[t] = now, seconds, recompute_seconds
        self.rebuilt[t] = plan.recompute
        self._memory.task_ended(t, u, plan.recompute, now)
        self.busy[u] = self.running[u] = None
        self.done[t] = True
        self.policy.complete(t, u, seconds, self)
        task = self.graph.tasks[t]
        if task.final:
            self.done_items[task.item] = now
            if self.next_item < len(self.items):
                k = self.items[self.next_item]
                self.next_item += 1
                for r in self.item_tasks[k]:
                    self.released.add(r)
                    if self.missing[r] == 0:
                        self._ready(r)
        for s in self.succ[t]:
            self.missing[s] -= 1
            if self.missing[s] == 0 and s in self.released:
                self._ready(s)

    # ---- the end --------------------------------------------------------------------
    def check_done(self) -> None:
        """InvalidProblem naming what could not run, unless every task ran."""
        left = [t for t in range(len(self.done)) if not self.done[t]]
        if not left:
            return
        names = [self.graph.tasks[t].name for t in left[:5]]
        mem = self._memory
        why = ""
        for t in left:
            if not self.ready[t]:
                continue
            for u in [self.device[t]] if self.device[t] else self.names:
                got = self._admission.needs(t, u)
                if got is None or self.cap[u] is None:
                    continue
                there = sum(self.layout.size[d] for d in self.layout.reads[t]
                            if self.present(d, u))  # fmt: skip
                task = self.graph.tasks[t].name
                if got.nbytes + there > self.cap[u]:
                    why = (
                        f"; {task} needs {got.nbytes + there} bytes at once on {u} (inputs, "
                        f"outputs, temporaries), which holds at most {self.cap[u]}"
                    )
                else:
                    why = (
                        f"; {task} needs {got.nbytes} more bytes on {u}, which holds "
                        f"{mem.held[u]} of {self.cap[u]} that it cannot evict"
                    )
                break
            if why:
                break
        raise InvalidProblem(f"dynamic run stalled; unfinished tasks: {names}{why}")

    def trace(self) -> DynamicTrace:
        """What the run did."""
        mem = self._memory
        completion = [self.done_items[k] for k in sorted(self.done_items)]
        return DynamicTrace(
            makespan=max(self.end, default=0.0),
            period=steady_period(completion),
            completion=completion,
            device=list(self.device),
            start=list(self.start),
            end=list(self.end),
            predicted_end=list(self.predicted_end),
            transfers=list(self._transfers.log),
            duration=list(self.duration),
            recompute=list(self.recompute),
            rebuilt=list(self.rebuilt),
            memory={u: (tuple(ts), tuple(ls)) for u, (ts, ls) in mem.memory_log.items()},
            device_peak=dict(mem.peak),
            evictions=list(self._eviction.log),
            graph=self.graph,
            platform=self.platform,
        )
