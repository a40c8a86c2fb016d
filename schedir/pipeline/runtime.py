"""The state dynamic policies read, and the runtime's rules: written once (one class,
kept in one module: its rules read each other's bookkeeping).

:class:`RuntimeState` is driven by the simulator (:func:`schedir.pipeline.dag.simulate_dynamic`)
and by the JAX runtime (``jax_exec.pipeline.dynamic``); each executor adds its clock and
carries out what the state decides. A policy (``solvers.pipeline.dynamic``) reads it
and answers three questions: ``push(task, state)`` -> the device whose queue a ready
task joins (None: a shared pool), ``order(device, tasks, state)`` -> the order in which
an idle device would start the candidates (default: as given), ``complete(task,
device, seconds, state)`` -> what it learns. ``static_lists`` (device -> tasks) fixes
placements upfront; ``strict`` makes a device run its queue in order.

The rules (docs/dynamic_training.md):

- **Placement.** A ready task goes to the device the policy names; with ``prefetch``
  its missing inputs start moving at once if they fit in the device's free memory.
- **Admission.** An idle device considers its ready queued tasks (strict: its head;
  an empty queue: the pool) in the policy's order and starts the first whose needs
  fit in its free memory: the inputs not yet there, its outputs, its temporary bytes
  and what recomputations need. If none fits, the first is admitted with evictions,
  if evicting can make room. If it cannot, the device takes the other ready tasks
  placed on it, in queue order (a fixed order could otherwise deadlock under a
  memory cap: the head waiting for room that only later tasks of the list free);
  otherwise it waits. Activations and gradients are evicted only to the host: without
  host links, micro-batches in flight can fill the devices with them, and the run
  stalls (reported, naming the task that cannot fit).
- **Eviction** (Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021): among
  the copies on the device that no started task uses, evict by increasing
  ``h = cost / (size * staleness)`` (staleness: seconds since last use) until the task
  fits. A copy with another copy (a device or the host) is freed (cost: the transfer
  back); the only copy of a recomputable datum is dropped (cost: its producer's time)
  or offloaded to the host (cost: both transfers), the cheaper; other data are
  offloaded when the platform has host links (``offload`` and ``prefetch`` engines)
  and never evicted otherwise. Parameters and inputs start on the host.
- **Inputs** come from the copy of least transfer time; a dropped datum, or a
  recomputable one whose recomputation takes less than that transfer, is rebuilt on
  the device by running its producer's computation before the task.
- **Freeing.** A datum is freed everywhere when its last reader ends; an output is
  kept. An accumulator lives as one partial sum per device that wrote it.
- **Memory** is counted per device: copies present or arriving, outputs from the start
  of the task writing them (or recomputing them), temporary bytes while it runs. It
  never exceeds the device's capacity: a task that cannot fit anywhere stalls the
  run, which is reported.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from schedir.errors import InvalidProblem
from schedir.pipeline.dataflow import HOST, SOURCES, DynamicTrace, data_layout
from schedir.pipeline.simulate import steady_period
from schedir.platform import Platform

PINNED = ("accumulator", "output")  # never evicted


@dataclass(frozen=True)
class Plan:
    """What a device does to run one task, in order.

    Attributes:
        task, device: the task and where it runs.
        evict: (datum, mode) evicted from the device first, mode ``"free"``,
            ``"offload"`` or ``"drop"``; offloads end before the task begins.
        fetch: (datum, source device or ``HOST``) moved to the device (for an
            accumulator: one partial sum per source).
        wait: data already arriving on the device (moved when the task was placed).
        recompute: dropped data the task rebuilds first (its producer's computation).
        alloc: bytes the task adds on the device when it begins.
    """

    task: int
    device: str
    evict: tuple[tuple[int, str], ...]
    fetch: tuple[tuple[int, str], ...]
    wait: tuple[int, ...]
    recompute: tuple[int, ...]
    alloc: int


class RuntimeState:
    """The state of one dynamic run (see the module docstring); policies read it.

    Read by policies: ``names``, ``speed``, ``now``, ``device``, ``start``, ``end``,
    ``queue``, ``pool``, ``running``, ``busy``, ``done``, ``graph``, ``platform``;
    ``ready``, ``cap``; ``nominal``, ``transfer_time``, ``data_ready_estimate``,
    ``queue_end``, ``fits``, ``memory_delay``. Written by policies:
    ``predicted_end`` and (``assign``) the queues of tasks not started yet.
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
        self.links = {(lk.src, lk.dst): lk for lk in platform.links}
        self.host_link = platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0
        self.prefetch = prefetch
        self._data_layout(graph)
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
        self.held = dict.fromkeys(self.names, 0)
        self.extra = dict.fromkeys(self.names, 0)  # temporaries and gathered partials
        self.reserved = dict.fromkeys(self.names, 0)  # admitted, not begun
        self.peak = dict.fromkeys(self.names, 0)
        self.memory_log = {u: ([0.0], [0]) for u in self.names}
        self.on_device: dict = {u: set() for u in self.names}
        self.pins: dict = defaultdict(int)
        self.last_use: dict = {}
        self.eta: dict = {}
        self.link_free: dict = {}
        self.transfers: list = []
        self.evictions: list = []
        self._pending: list = []
        self._freed: list = []
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

    def _data_layout(self, graph) -> None:
        lay = data_layout(graph)
        self.size, self.kind, self.name = lay.size, lay.kind, lay.name
        self.reads, self.writes, self.producer = lay.reads, lay.writes, lay.producer
        self.droppable = lay.droppable
        nd = len(self.size)
        self.left = [len(r) for r in lay.readers]
        self.readers = lay.readers
        tasks = graph.tasks
        self.footprint = [t.temp + sum(self.size[d] for d in {*self.reads[k], *self.writes[k]})
                          for k, t in enumerate(tasks)]  # fmt: skip
        # bytes a recomputation adds: its producer's temporaries and other outputs
        self.rebuild_bytes = [
            0 if p is None else tasks[p].temp + sum(
                self.size[w] for w in self.writes[p] if w != d and self.kind[w] != "accumulator")
            for d, p in enumerate(self.producer)
        ]  # fmt: skip
        self.copies: list = [{} for _ in range(nd)]  # device -> present, arriving, pending, leaving
        self.on_host = [k in SOURCES for k in self.kind]
        self.dropped = [False] * nd

    # ---- what policies read -------------------------------------------------------
    @property
    def now(self) -> float:
        return self._clock()

    def nominal(self, task: int, dev: str) -> float:
        """Seconds the profile predicts for ``task`` on ``dev``."""
        return self.graph.tasks[task].work / self.speed[dev]

    def transfer_time(self, src: str, dst: str, nbytes: int, datum: int | None = None) -> float:
        """Seconds to move ``nbytes`` from ``src`` to ``dst`` (inf without a link). From
        the host: ``platform.prefetch`` (0 for a source without host links); to it:
        ``platform.offload``."""
        if src == dst:
            return 0.0
        if src == HOST:
            return self.platform.prefetch.time(nbytes) if self.host_link else 0.0
        if dst == HOST:
            return self.platform.offload.time(nbytes) if self.host_link else math.inf
        link = self.links.get((src, dst))
        return math.inf if link is None else link.time(nbytes)

    def data_ready_estimate(self, task: int, dev: str) -> float:
        """When the inputs of ``task`` would be on ``dev`` if sent now (link queues kept)."""
        now = self.now
        ready, busy = now, dict(self.link_free)
        for d in self.reads[task]:
            sources = self._partials(d, dev) if self.kind[d] == "accumulator" else [None]
            for src in sources:
                if src is None:
                    state = self.copies[d].get(dev)
                    if state == "present":
                        continue
                    if state == "arriving":
                        ready = max(ready, self.eta.get((d, dev), now))
                        continue
                    if self.dropped[d]:
                        ready = max(ready, now + self.nominal(self.producer[d], dev))
                        continue
                    src = self._source(d, dev)
                    if src is None:
                        return math.inf
                key = (src, dev)
                t = max(now, busy.get(key, 0.0)) + self.transfer_time(src, dev, self.size[d])
                busy[key] = t
                ready = max(ready, t)
        return ready

    def queue_end(self, dev: str, predict) -> float:
        """Predicted time at which ``dev`` finishes what it holds (``predict(task, dev)``)."""
        t = self.now
        plan = self.busy[dev]
        if plan is not None:
            r = plan.task
            begun = self.start[r] if self.running[dev] == r else t
            t = max(t, begun + predict(r, dev))
        for q in self.queue[dev]:
            t = max(t, self._arrival(q, dev)) + predict(q, dev)
        return t

    def fits(self, task: int, dev: str) -> bool:
        """Whether ``task`` would fit on ``dev`` now without evicting anything."""
        got = self._needs(task, dev)
        return got is not None and got[0] <= self._room(dev)

    def memory_delay(self, task: int, dev: str) -> float:
        """Seconds ``dev`` would spend making room for ``task`` now: 0 if it fits, the
        offload time of the bytes short with host links (0 without), inf if the task
        needs more than the device holds."""
        cap = self.cap[dev]
        if cap is None:
            return 0.0
        got = self._needs(task, dev)
        need = got[0] if got else 0
        if need > cap:
            return math.inf
        short = need - (cap - self.held[dev] - self.reserved[dev])
        if short <= 0 or not self.host_link:
            return 0.0
        return short / self.platform.offload.bandwidth

    # ---- placement ----------------------------------------------------------------
    def start_run(self) -> None:
        """Make the first tasks ready (the policy places them)."""
        for t in sorted(self.released):
            if self.missing[t] == 0:
                self._ready(t)

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
                    self._prefetch(t, u)

    def _check_device(self, u) -> None:
        if u not in self.queue:
            raise InvalidProblem(f"policy placed a task on unknown device {u!r}; "
                                 f"known: {self.names}")  # fmt: skip

    def _ready(self, t: int) -> None:
        self.ready[t] = True
        if self.device[t] is not None:  # placed upfront (static lists)
            self._prefetch(t, self.device[t])
            return
        dev = self.policy.push(t, self)
        if dev is None:
            self.pool.append(t)
            return
        self._check_device(dev)
        self.device[t] = dev
        self.queue[dev].append(t)
        self._prefetch(t, dev)

    def _prefetch(self, t: int, u: str) -> None:
        if not self.prefetch:
            return
        for d in self.reads[t]:
            if self.kind[d] == "accumulator" or u in self.copies[d] or self.dropped[d]:
                continue
            src = self._source(d, u)
            if src is None or self._room(u) < self.size[d] or self._rebuild_here(d, u, src):
                continue
            self._add_copy(d, u, "arriving")
            if src != HOST:
                self.pins[d, src] += 1
            self._pending.append((d, src, u))

    def take_transfers(self) -> list:
        """Transfers the state started on placement since the last call: (datum, src, dst)."""
        out, self._pending = self._pending, []
        return out

    def take_freed(self) -> list:
        """Copies freed since the last call: (datum, device or ``HOST``)."""
        out, self._freed = self._freed, []
        return out

    def expect(self, d: int, dev: str, when: float) -> None:
        """The executor's expected arrival time of ``d`` on ``dev``."""
        self.eta[d, dev] = when

    # ---- admission ----------------------------------------------------------------
    def next_plan(self, u: str) -> Plan | None:
        """What idle device ``u`` does next (see the module docstring), or None: wait."""
        if self.busy[u] is not None:
            return None
        cands = self._candidates(u)
        plan = None
        for t in cands:
            plan = self._plan(t, u, evict=False)
            if plan is not None:
                break
        if plan is None and cands:
            plan = self._plan(cands[0], u, evict=True)
        if plan is None and cands:
            # stuck (what the policy chose cannot fit): the other ready tasks placed
            # here, in queue order, so that a fixed order cannot deadlock on memory
            others = [t for t in self.queue[u] if self.ready[t] and t not in cands]
            for evict in (False, True):
                plan = next((p for t in others if (p := self._plan(t, u, evict))), None)
                if plan is not None:
                    break
        if plan is None:
            return None
        t = plan.task
        if self.device[t] == u and t in self.queue[u]:
            self.queue[u].remove(t)
        else:
            self.pool.remove(t)
        self.device[t] = u
        self.busy[u] = plan
        self.reserved[u] = plan.alloc
        for d, src in plan.fetch:  # a source copy stays until the transfer ends
            if src != HOST:
                self.pins[d, src] += 1
        for d, mode in plan.evict:
            self.evictions.append((self.now, self.name[d], u, mode))
            if mode == "offload":  # no other device takes it from here meanwhile
                self.copies[d][u] = "leaving"
                continue
            self._free_copy(d, u)
            if mode == "drop":
                self.dropped[d] = True
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

    def _needs(self, t: int, u: str):
        """(bytes, fetch, wait, recompute) of running ``t`` on ``u`` now, or None when an
        input cannot reach ``u`` yet."""
        task = self.graph.tasks[t]
        need, fetch, wait, rec = task.temp, [], [], []
        for d in self.reads[t]:
            if self.kind[d] == "accumulator":
                for v in self._partials(d, u):
                    fetch.append((d, v))
                    need += self.size[d]
                continue
            state = self.copies[d].get(u)
            if state == "present":
                continue
            if state == "arriving":
                wait.append(d)
                continue
            if self.dropped[d]:
                rec.append(d)
                need += self.size[d] + self.rebuild_bytes[d]
                continue
            src = self._source(d, u)
            if self._rebuild_here(d, u, src):
                rec.append(d)
                need += self.size[d] + self.rebuild_bytes[d]
                continue
            if src is None:
                return None
            fetch.append((d, src))
            need += self.size[d]
        for d in self.writes[t]:
            if self.kind[d] != "accumulator" or u not in self.copies[d]:
                need += self.size[d]
        return need, fetch, wait, rec

    def _plan(self, t: int, u: str, evict: bool) -> Plan | None:
        got = self._needs(t, u)
        if got is None:
            return None
        need, fetch, wait, rec = got
        room = self._room(u)
        chosen: list = []
        if need > room:
            if not evict:
                return None
            protect = set(self.reads[t]) | set(self.writes[t])
            now, cands = self.now, []
            for d in self.on_device[u]:
                if (self.copies[d].get(u) != "present" or d in protect or self.pins[d, u]
                        or self.kind[d] in PINNED or self.size[d] == 0):  # fmt: skip
                    continue
                mode, cost = self._evict_mode(d, u)
                if mode is None:
                    continue
                stale = max(now - self.last_use.get((d, u), 0.0), 1e-12)
                cands.append((cost / (self.size[d] * stale), d, mode))
            freed = 0
            for _, d, mode in sorted(cands):
                chosen.append((d, mode))
                freed += self.size[d]
                if need <= room + freed:
                    break
            else:
                return None
        return Plan(t, u, tuple(chosen), tuple(fetch), tuple(wait), tuple(rec), need)

    def _evict_mode(self, d: int, u: str) -> tuple[str | None, float]:
        """How to evict the copy of ``d`` on ``u``, and what it costs (seconds)."""
        size = self.size[d]
        others = [v for v, s in self.copies[d].items() if v != u and s == "present"]
        if others or self.on_host[d]:
            back = [self.transfer_time(v, u, size) for v in others]
            if self.on_host[d]:
                back.append(self.transfer_time(HOST, u, size))
            return "free", min(back)
        modes = []
        p = self.producer[d]
        if self.droppable[d] and not any(self.dropped[r] for r in self.reads[p]):
            # only if a reader can still run somewhere with the recomputation added
            most = max((math.inf if c is None else c) for c in self.cap.values())
            if all(self.footprint[r] + self.rebuild_bytes[d] <= most
                   for r in self.readers[d] if not self.done[r]):  # fmt: skip
                modes.append((self.nominal(p, u), "drop"))
        if self.host_link:
            modes.append((self.transfer_time(u, HOST, size) + self.transfer_time(HOST, u, size),
                          "offload"))  # fmt: skip
        if not modes:
            return None, math.inf
        cost, mode = min(modes)
        return mode, cost

    def _rebuild_here(self, d: int, u: str, src: str | None) -> bool:
        """Whether recomputing ``d`` on ``u`` beats moving it from ``src`` (None: no
        copy to move)."""
        if not self.droppable[d] or self.left[d] == 0:
            return False
        p = self.producer[d]
        if any(self.dropped[r] for r in self.reads[p]):
            return False
        move = math.inf if src is None else self.transfer_time(src, u, self.size[d])
        return self.nominal(p, u) < move

    def _room(self, u: str) -> float:
        cap = self.cap[u]
        return math.inf if cap is None else cap - self.held[u] - self.reserved[u]

    def _source(self, d: int, u: str) -> str | None:
        """The copy of ``d`` with the least transfer time to ``u`` (None: none yet)."""
        best, when = None, math.inf
        for v, state in self.copies[d].items():
            if v != u and state == "present":
                t = self.transfer_time(v, u, self.size[d])
                if t < when:
                    best, when = v, t
        if self.on_host[d] and self.transfer_time(HOST, u, self.size[d]) < when:
            best = HOST
        return best

    def _partials(self, d: int, u: str) -> list[str]:
        return [v for v in self.copies[d] if v != u]

    def _arrival(self, q: int, dev: str) -> float:
        now = self.now
        return max([now] + [self.eta.get((d, dev), now) for d in self.reads[q]
                            if self.copies[d].get(dev) == "arriving"])  # fmt: skip

    # ---- carrying a plan out --------------------------------------------------------
    def offloaded(self, d: int, u: str) -> None:
        """The offload of ``d`` from ``u`` ended: it is on the host now."""
        self.on_host[d] = True
        self._free_copy(d, u)

    def begin(self, plan: Plan) -> None:
        """The plan's evictions are done: allocate what it adds and start its fetches."""
        u, t = plan.device, plan.task
        self.reserved[u] = 0
        now = self.now
        for d, _ in plan.fetch:
            if self.kind[d] == "accumulator":
                self._grow(u, self.size[d])
            else:
                self._add_copy(d, u, "arriving")
        for d in plan.recompute:
            self.dropped[d] = False
            self._add_copy(d, u, "pending")
            self._grow(u, self.rebuild_bytes[d])
        for d in self.writes[t]:
            if u not in self.copies[d]:
                self._add_copy(d, u, "pending")
        self._grow(u, self.graph.tasks[t].temp)
        for d in self.reads[t]:
            self.last_use[d, u] = now
        cap = self.cap[u]
        if cap is not None and self.held[u] > cap:  # the admission rule prevents it
            raise RuntimeError(f"runtime bug: {self.held[u]} bytes on {u} > {cap} after "
                               f"admitting {self.graph.tasks[t].name}")  # fmt: skip

    def arrived(self, d: int, u: str, src: str) -> None:
        """A transfer of ``d`` from ``src`` to ``u`` ended."""
        if src != HOST:
            self.pins[d, src] -= 1
        if self.kind[d] != "accumulator" and self.copies[d].get(u) == "arriving":
            self.copies[d][u] = "present"
            self.last_use[d, u] = self.now

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
        for d in (*self.writes[t], *plan.recompute):
            if self.copies[d].get(u) == "pending":
                self.copies[d][u] = "present"
            self.last_use[d, u] = now
        self._grow(u, -self.extra[u])
        self.busy[u] = self.running[u] = None
        self.done[t] = True
        for d in self.reads[t]:
            self.left[d] -= 1
            self.last_use[d, u] = now
            if self.left[d] == 0:
                self._free_all(d)
        for d in self.writes[t]:
            if self.left[d] == 0 and self.kind[d] not in PINNED:
                self._free_all(d)  # read by no task
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

    # ---- memory bookkeeping ---------------------------------------------------------
    def _add_copy(self, d: int, u: str, state: str) -> None:
        self.copies[d][u] = state
        self.on_device[u].add(d)
        self._grow(u, self.size[d], data=True)

    def _free_copy(self, d: int, u: str) -> None:
        del self.copies[d][u]
        self.on_device[u].discard(d)
        self._freed.append((d, u))
        self._grow(u, -self.size[d], data=True)

    def _free_all(self, d: int) -> None:
        for v in list(self.copies[d]):
            self._free_copy(d, v)
        if self.on_host[d]:
            self.on_host[d] = False
            self._freed.append((d, HOST))

    def _grow(self, u: str, nbytes: int, data: bool = False) -> None:
        if not nbytes:
            return
        self.held[u] += nbytes
        if not data:
            self.extra[u] += nbytes
        times, levels = self.memory_log[u]
        now = self.now
        if times[-1] == now:
            levels[-1] = self.held[u]
        else:
            times.append(now)
            levels.append(self.held[u])
        self.peak[u] = max(self.peak[u], self.held[u])

    # ---- the end --------------------------------------------------------------------
    def check_done(self) -> None:
        """InvalidProblem naming what could not run, unless every task ran."""
        left = [t for t in range(len(self.done)) if not self.done[t]]
        if not left:
            return
        names = [self.graph.tasks[t].name for t in left[:5]]
        why = ""
        for t in left:
            if not self.ready[t]:
                continue
            for u in [self.device[t]] if self.device[t] else self.names:
                got = self._needs(t, u)
                if got is None or self.cap[u] is None:
                    continue
                there = sum(self.size[d] for d in self.reads[t]
                            if self.copies[d].get(u) == "present")  # fmt: skip
                task = self.graph.tasks[t].name
                if got[0] + there > self.cap[u]:
                    why = (
                        f"; {task} needs {got[0] + there} bytes at once on {u} (inputs, "
                        f"outputs, temporaries), which holds at most {self.cap[u]}"
                    )
                else:
                    why = (
                        f"; {task} needs {got[0]} more bytes on {u}, which holds "
                        f"{self.held[u]} of {self.cap[u]} that it cannot evict"
                    )
                break
            if why:
                break
        raise InvalidProblem(f"dynamic run stalled; unfinished tasks: {names}{why}")

    def trace(self) -> DynamicTrace:
        completion = [self.done_items[k] for k in sorted(self.done_items)]
        return DynamicTrace(
            makespan=max(self.end, default=0.0),
            period=steady_period(completion),
            completion=completion,
            device=list(self.device),
            start=list(self.start),
            end=list(self.end),
            predicted_end=list(self.predicted_end),
            transfers=list(self.transfers),
            duration=list(self.duration),
            recompute=list(self.recompute),
            rebuilt=list(self.rebuilt),
            memory={u: (tuple(ts), tuple(ls)) for u, (ts, ls) in self.memory_log.items()},
            device_peak=dict(self.peak),
            evictions=list(self.evictions),
            graph=self.graph,
            platform=self.platform,
        )
