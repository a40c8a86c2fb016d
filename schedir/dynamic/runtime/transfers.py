"""The transfers rule of the dynamic runtime: where a task's inputs come from, when
they arrive, and the links' timing.

- **Inputs** come from the copy of least transfer time (another device's, or the
  host's); a dropped datum, or a recomputable one whose recomputation takes less than
  that transfer, is rebuilt on the device by running its producer's computation
  before the task (:meth:`Transfers.rebuild_here`). An accumulator's reader gathers
  one partial sum from every other device holding one.
- **Prefetch.** With ``prefetch``, a task's missing inputs start moving when it is
  placed on a device, if they fit in the device's free memory
  (:meth:`Transfers.prefetch`); otherwise they move when the device admits it.
- **Link timing** (an executor that simulates time): a transfer takes
  ``link.time(bytes)`` on its directed link, a serial resource served in FIFO order;
  moves to and from the host use ``platform.prefetch`` / ``platform.offload``, one
  engine per device and direction (untimed for the initial copy of parameters and
  inputs when the platform has no host link) (:meth:`Transfers.book`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from schedir.dynamic.dataflow import HOST, DataLayout
from schedir.dynamic.runtime.residency import Residency
from schedir.platform import Platform


class Transfers:
    """Moves of data between devices and the host (module docstring).

    ``nominal(task, device)``: the profile's seconds of a task on a device (a rebuild
    is weighed against a transfer with it). ``log``: (src, dst, bytes, start, end) of
    every booked transfer.
    """

    def __init__(self, platform: Platform, layout: DataLayout, memory: Residency,
                 nominal: Callable[[int, str], float], clock: Callable[[], float],
                 prefetch: bool):  # fmt: skip
        self.platform, self.layout, self.memory = platform, layout, memory
        self.nominal, self._clock, self.prefetch_on = nominal, clock, prefetch
        self.links = {(lk.src, lk.dst): lk for lk in platform.links}
        self.host_link = platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0
        self.eta: dict = {}  # (datum, device) -> expected arrival of a booked transfer
        self.link_free: dict = {}  # (src, dst) -> when the link is free again
        self.log: list = []
        self._started: list = []

    def time(self, src: str, dst: str, nbytes: int) -> float:
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

    def source(self, d: int, u: str) -> str | None:
        """The copy of ``d`` with the least transfer time to ``u`` (None: none yet)."""
        size = self.layout.size[d]
        best, when = None, math.inf
        for v, state in self.memory.copies[d].items():
            if v != u and state == "present":
                t = self.time(v, u, size)
                if t < when:
                    best, when = v, t
        if self.memory.on_host[d] and self.time(HOST, u, size) < when:
            best = HOST
        return best

    def partials(self, d: int, u: str) -> list[str]:
        """The devices whose partial sums of accumulator ``d`` a reader on ``u`` gathers."""
        return [v for v in self.memory.copies[d] if v != u]

    def rebuild_here(self, d: int, u: str, src: str | None) -> bool:
        """Whether recomputing ``d`` on ``u`` beats moving it from ``src`` (None: no
        copy to move)."""
        lay, mem = self.layout, self.memory
        if not lay.droppable[d] or mem.left[d] == 0:
            return False
        p = lay.producer[d]
        if any(mem.dropped[r] for r in lay.reads[p]):
            return False
        move = math.inf if src is None else self.time(src, u, lay.size[d])
        return self.nominal(p, u) < move

    def ready_estimate(self, task: int, dev: str) -> float:
        """When the inputs of ``task`` would be on ``dev`` if sent now (link queues kept)."""
        lay, mem = self.layout, self.memory
        now = self._clock()
        ready, busy = now, dict(self.link_free)
        for d in lay.reads[task]:
            sources = self.partials(d, dev) if lay.kind[d] == "accumulator" else [None]
            for src in sources:
                if src is None:
                    state = mem.copies[d].get(dev)
                    if state == "present":
                        continue
                    if state == "arriving":
                        ready = max(ready, self.eta.get((d, dev), now))
                        continue
                    if mem.dropped[d]:
                        ready = max(ready, now + self.nominal(lay.producer[d], dev))
                        continue
                    src = self.source(d, dev)
                    if src is None:
                        return math.inf
                key = (src, dev)
                t = max(now, busy.get(key, 0.0)) + self.time(src, dev, lay.size[d])
                busy[key] = t
                ready = max(ready, t)
        return ready

    def arrival(self, task: int, dev: str) -> float:
        """When the inputs of ``task`` already moving to ``dev`` are expected there."""
        now = self._clock()
        return max([now] + [self.eta.get((d, dev), now) for d in self.layout.reads[task]
                            if self.memory.copies[d].get(dev) == "arriving"])  # fmt: skip

    def prefetch(self, t: int, u: str) -> None:
        """Start moving the inputs of ``t``, just placed on ``u``, that fit there now."""
        if not self.prefetch_on:
            return
        lay, mem = self.layout, self.memory
        for d in lay.reads[t]:
            if lay.kind[d] == "accumulator" or u in mem.copies[d] or mem.dropped[d]:
                continue
            src = self.source(d, u)
            if src is None or mem.room(u) < lay.size[d] or self.rebuild_here(d, u, src):
                continue
            mem.add_copy(d, u, "arriving")
            if src != HOST:
                mem.pins[d, src] += 1
            self._started.append((d, src, u))

    def take_started(self) -> list:
        """Transfers started on placement since the last call: (datum, src, dst)."""
        out, self._started = self._started, []
        return out

    def arrived(self, d: int, u: str, src: str, now: float) -> None:
        """A transfer of ``d`` from ``src`` to ``u`` ended at ``now``."""
        mem = self.memory
        if src != HOST:
            mem.pins[d, src] -= 1
        if self.layout.kind[d] != "accumulator" and mem.copies[d].get(u) == "arriving":
            mem.copies[d][u] = "present"
            mem.touch(d, u, now)

    def book(self, d: int, src: str, dst: str) -> float:
        """Time a transfer of ``d`` from ``src`` to ``dst`` on its link, FIFO from now;
        returns its end (also the expected arrival of ``d`` on ``dst``)."""
        end = self._reserve(src, dst, self.layout.size[d])
        self.eta[d, dst] = end
        return end

    def book_offload(self, d: int, u: str) -> float:
        """Time the offload of ``d`` from ``u`` to the host; returns its end."""
        return self._reserve(u, HOST, self.layout.size[d])

    def _reserve(self, src: str, dst: str, nbytes: int) -> float:
        key = (src, dst)
        start = max(self._clock(), self.link_free.get(key, 0.0))
        end = start + self.time(src, dst, nbytes)
        if end > start:
            self.link_free[key] = end
        self.log.append((src, dst, nbytes, start, end))
        return end
