"""The admission rule of the dynamic runtime: what a task needs on a device, whether
it fits, and the plan a device carries out to run it.

A task's needs on a device (:meth:`Admission.needs`): the inputs not yet there (each
from the copy of least transfer time, or rebuilt: :mod:`.transfers`), its outputs, its
temporary bytes and what recomputations need. An idle device considers its candidate
tasks in the policy's order and starts the first whose needs fit in its free memory;
if none fits, the first is admitted with evictions (:mod:`.eviction`), if evicting can
make room; if it cannot, the device takes the other ready tasks placed on it, in queue
order (a fixed order could otherwise deadlock under a memory cap: the head waiting
for room that only later tasks of the list free), first without evicting, then with;
otherwise it waits (:meth:`Admission.select`).

**Memory** is counted per device: copies present or arriving, outputs from the start
of the task writing them (or recomputing them), temporary bytes while it runs. It
never exceeds the device's capacity: admitting a plan reserves its bytes until it
begins (:meth:`Admission.commit`), and a task that cannot fit anywhere stalls the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedir.dynamic.dataflow import HOST, DataLayout
from schedir.dynamic.runtime.eviction import Eviction
from schedir.dynamic.runtime.residency import Residency
from schedir.dynamic.runtime.transfers import Transfers


@dataclass(frozen=True)
class TaskPlan:
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


@dataclass(frozen=True)
class Needs:
    """What running a task on a device takes now: ``nbytes`` more on the device, the
    ``fetch`` (datum, source) moves, the data it ``wait`` s for (already arriving) and
    those it must ``recompute``."""

    nbytes: int
    fetch: tuple[tuple[int, str], ...]
    wait: tuple[int, ...]
    recompute: tuple[int, ...]


class Admission:
    """Admit the tasks of a graph (``tasks``) on devices (module docstring)."""

    def __init__(self, tasks: Sequence, layout: DataLayout, memory: Residency,
                 transfers: Transfers, eviction: Eviction):  # fmt: skip
        self.tasks, self.layout, self.memory = tasks, layout, memory
        self.transfers, self.eviction = transfers, eviction

    def needs(self, t: int, u: str) -> Needs | None:
        """What running ``t`` on ``u`` takes now, or None when an input cannot reach
        ``u`` yet."""
        lay, mem, moves = self.layout, self.memory, self.transfers
        need, fetch, wait, rec = self.tasks[t].temp, [], [], []
        for d in lay.reads[t]:
            if lay.kind[d] == "accumulator":
                for v in moves.partials(d, u):
                    fetch.append((d, v))
                    need += lay.size[d]
                continue
            state = mem.copies[d].get(u)
            if state == "present":
                continue
            if state == "arriving":
                wait.append(d)
                continue
            if mem.dropped[d]:
                rec.append(d)
                need += lay.size[d] + lay.rebuild_bytes[d]
                continue
            src = moves.source(d, u)
            if moves.rebuild_here(d, u, src):
                rec.append(d)
                need += lay.size[d] + lay.rebuild_bytes[d]
                continue
            if src is None:
                return None
            fetch.append((d, src))
            need += lay.size[d]
        for d in lay.writes[t]:
            if lay.kind[d] != "accumulator" or u not in mem.copies[d]:
                need += lay.size[d]
        return Needs(need, tuple(fetch), tuple(wait), tuple(rec))

    def fits(self, t: int, u: str) -> bool:
        """Whether ``t`` would fit on ``u`` now without evicting anything."""
        got = self.needs(t, u)
        return got is not None and got.nbytes <= self.memory.room(u)

    def memory_delay(self, t: int, u: str) -> float:
        """Seconds ``u`` would spend making room for ``t`` now: 0 if it fits, the
        offload time of the bytes short with host links (0 without), inf if the task
        needs more than the device holds."""
        mem = self.memory
        cap = mem.cap[u]
        if cap is None:
            return 0.0
        got = self.needs(t, u)
        need = got.nbytes if got else 0
        if need > cap:
            return math.inf
        short = need - (cap - mem.held[u] - mem.reserved[u])
        if short <= 0 or not self.transfers.host_link:
            return 0.0
        return short / self.transfers.platform.offload.bandwidth

    def plan(self, t: int, u: str, evict: bool) -> TaskPlan | None:
        """The plan of running ``t`` on ``u`` now (evicting if ``evict`` and needed),
        or None when it cannot start there now."""
        got = self.needs(t, u)
        if got is None:
            return None
        room = self.memory.room(u)
        chosen: tuple = ()
        if got.nbytes > room:
            if not evict:
                return None
            chosen = self.eviction.victims(t, u, got.nbytes, room)
            if chosen is None:
                return None
        return TaskPlan(t, u, chosen, got.fetch, got.wait, got.recompute, got.nbytes)

    def select(self, u: str, candidates: Sequence[int],
               others: Callable[[], list[int]]) -> TaskPlan | None:  # fmt: skip
        """The plan idle device ``u`` carries out next: the first of ``candidates`` that
        fits, else the first with evictions, else (``others()``: the other ready tasks
        placed on ``u``, in queue order) the first of those that fits, then with
        evictions; None: it waits."""
        plan = None
        for t in candidates:
            plan = self.plan(t, u, evict=False)
            if plan is not None:
                break
        if plan is None and candidates:
            plan = self.plan(candidates[0], u, evict=True)
        if plan is None and candidates:
            # stuck (what the policy chose cannot fit): the other ready tasks placed
            # here, in queue order, so that a fixed order cannot deadlock on memory
            rest = others()
            for evict in (False, True):
                plan = next((p for t in rest if (p := self.plan(t, u, evict))), None)
                if plan is not None:
                    break
        return plan

    def commit(self, plan: TaskPlan) -> None:
        """The device admitted ``plan``: reserve its bytes, keep its sources until their
        transfers end and start its evictions."""
        mem = self.memory
        mem.reserved[plan.device] = plan.alloc
        for d, src in plan.fetch:  # a source copy stays until the transfer ends
            if src != HOST:
                mem.pins[d, src] += 1
        self.eviction.carry_out(plan.evict, plan.device)

    def begin(self, plan: TaskPlan, now: float) -> None:
        """The plan's evictions are done: allocate what it adds on its device (the
        fetches arriving, the recomputed data and outputs pending, the temporaries)."""
        lay, mem = self.layout, self.memory
        u, t = plan.device, plan.task
        mem.reserved[u] = 0
        for d, _ in plan.fetch:
            if lay.kind[d] == "accumulator":
                mem.grow(u, lay.size[d])
            else:
                mem.add_copy(d, u, "arriving")
        for d in plan.recompute:
            mem.dropped[d] = False
            mem.add_copy(d, u, "pending")
            mem.grow(u, lay.rebuild_bytes[d])
        for d in lay.writes[t]:
            if u not in mem.copies[d]:
                mem.add_copy(d, u, "pending")
        mem.grow(u, self.tasks[t].temp)
        for d in lay.reads[t]:
            mem.touch(d, u, now)
        cap = mem.cap[u]
        if cap is not None and mem.held[u] > cap:  # the rule above prevents it
            raise RuntimeError(f"runtime bug: {mem.held[u]} bytes on {u} > {cap} after "
                               f"admitting {self.tasks[t].name}")  # fmt: skip
