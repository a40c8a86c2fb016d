"""The eviction rule of the dynamic runtime: which data leave a device to make room,
and how (Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021).

Among the copies on the device that no started task uses (not read or written by the
task being admitted, not the source of a transfer, not an accumulator or an output,
not empty), evict by increasing ``h = cost / (size * staleness)`` (staleness: seconds
since last use) until the task fits (:meth:`Eviction.victims`). How a copy is evicted
and what it costs (:meth:`Eviction.mode`):

- a copy with another copy (a device or the host) is freed (cost: the transfer back);
- the only copy of a recomputable datum is dropped (cost: its producer's time; only
  while every reader still to run fits somewhere with the recomputation added) or
  offloaded to the host (cost: both transfers), the cheaper;
- other data are offloaded when the platform has host links (``offload`` and
  ``prefetch`` engines) and never evicted otherwise: without host links,
  micro-batches in flight can fill the devices with activations and gradients, and
  the run stalls (reported).

An offload ends before the task that asked for the room begins (:meth:`offloaded`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from schedir.dynamic.dataflow import HOST, DataLayout
from schedir.dynamic.runtime.residency import PINNED, Residency
from schedir.dynamic.runtime.transfers import Transfers


class Eviction:
    """Choose and carry out evictions (module docstring).

    ``done``: the run's per-task done flags (read only); ``log``: (time, datum name,
    device, mode) of every eviction.
    """

    def __init__(self, layout: DataLayout, memory: Residency, transfers: Transfers,
                 done: Sequence[bool], clock: Callable[[], float]):  # fmt: skip
        self.layout, self.memory, self.transfers = layout, memory, transfers
        self.done, self._clock = done, clock
        self.log: list = []

    def mode(self, d: int, u: str) -> tuple[str | None, float]:
        """How to evict the copy of ``d`` on ``u`` (None: it cannot be), and what it
        costs (seconds)."""
        lay, mem, time = self.layout, self.memory, self.transfers.time
        size = lay.size[d]
        others = [v for v, s in mem.copies[d].items() if v != u and s == "present"]
        if others or mem.on_host[d]:
            back = [time(v, u, size) for v in others]
            if mem.on_host[d]:
                back.append(time(HOST, u, size))
            return "free", min(back)
        modes = []
        p = lay.producer[d]
        if lay.droppable[d] and not any(mem.dropped[r] for r in lay.reads[p]):
            # only if a reader can still run somewhere with the recomputation added
            most = max((math.inf if c is None else c) for c in mem.cap.values())
            if all(lay.footprint[r] + lay.rebuild_bytes[d] <= most
                   for r in lay.readers[d] if not self.done[r]):  # fmt: skip
                modes.append((self.transfers.nominal(p, u), "drop"))
        if self.transfers.host_link:
            modes.append((time(u, HOST, size) + time(HOST, u, size), "offload"))
        if not modes:
            return None, math.inf
        cost, mode = min(modes)
        return mode, cost

    def victims(self, t: int, u: str, need: int, room: float) -> tuple[tuple[int, str], ...] | None:
        """(datum, mode) to evict from ``u``, in order, so that task ``t``, which needs
        ``need`` bytes where ``room`` are free, fits; None when evicting cannot."""
        lay, mem = self.layout, self.memory
        protect = set(lay.reads[t]) | set(lay.writes[t])
        now, cands = self._clock(), []
        for d in mem.on_device[u]:
            if (mem.copies[d].get(u) != "present" or d in protect or mem.pins[d, u]
                    or lay.kind[d] in PINNED or lay.size[d] == 0):  # fmt: skip
                continue
            mode, cost = self.mode(d, u)
            if mode is None:
                continue
            stale = max(now - mem.last_use.get((d, u), 0.0), 1e-12)
            cands.append((cost / (lay.size[d] * stale), d, mode))
        chosen, freed = [], 0
        for _, d, mode in sorted(cands):
            chosen.append((d, mode))
            freed += lay.size[d]
            if need <= room + freed:
                return tuple(chosen)
        return None

    def carry_out(self, evict: Sequence[tuple[int, str]], u: str) -> None:
        """Start the evictions of an admitted plan: a copy offloaded stays (leaving,
        so that no other device takes it from here) until :meth:`offloaded`; the
        others are freed at once (a dropped datum is rebuilt by its next reader)."""
        mem = self.memory
        for d, mode in evict:
            self.log.append((self._clock(), self.layout.name[d], u, mode))
            if mode == "offload":
                mem.copies[d][u] = "leaving"
                continue
            mem.free_copy(d, u)
            if mode == "drop":
                mem.dropped[d] = True

    def offloaded(self, d: int, u: str) -> None:
        """The offload of ``d`` from ``u`` ended: it is on the host now (unless no task
        reads it any more: :meth:`.residency.Residency.offload_ended`)."""
        self.memory.offload_ended(d, u)
