"""Where the data of a dynamic run live and what each device holds: the bookkeeping
that the runtime's rules (admission, eviction, transfers) read, and the freeing rule.

A datum has at most one copy per device, in one of four states: ``"arriving"`` (a
transfer to the device is under way), ``"pending"`` (the task writing or recomputing
it has begun), ``"present"`` and ``"leaving"`` (being offloaded to the host). It may
also be on the host (sources from the start, offloaded data after their offload) or
dropped (recomputed by its next reader). The bytes a device holds count every copy
there in any state, plus the temporaries of the task running there and the partial
sums it gathered (``extra``).

**Freeing.** A datum is freed everywhere when its last reader ends; an output is
kept; a datum read by no task is freed when its writer ends (an output aside). A copy
being offloaded when its last reader ends (on another device) holds its bytes until
the offload ends, and the host copy it made is freed then (:meth:`Residency.offload_ended`).
An accumulator lives as one partial sum per device that wrote it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

from schedir.dynamic.dataflow import HOST, SOURCES, DataLayout

PINNED = ("accumulator", "output")  # never evicted, nor freed before the run ends


class Residency:
    """The copies of every datum and the bytes of every device (module docstring).

    ``cap``: device -> bytes it may hold (None: unlimited); ``clock``: the run's time.
    Read by the rules: ``copies`` (per datum, device -> state), ``on_host``,
    ``dropped``, ``on_device`` (per device, the data with a copy there), ``held``,
    ``reserved`` (bytes of an admitted plan not begun yet), ``pins`` (transfers
    reading a copy), ``last_use`` and ``left`` (readers still to run, per datum).
    """

    def __init__(self, layout: DataLayout, cap: dict, clock: Callable[[], float]):
        self.layout, self.cap, self._clock = layout, cap, clock
        names = list(cap)
        nd = len(layout.size)
        self.copies: list = [{} for _ in range(nd)]  # device -> present, arriving, ...
        self.on_host = [k in SOURCES for k in layout.kind]
        self.dropped = [False] * nd
        self.left = [len(r) for r in layout.readers]
        self.held = dict.fromkeys(names, 0)
        self.extra = dict.fromkeys(names, 0)  # temporaries and gathered partials
        self.reserved = dict.fromkeys(names, 0)  # admitted, not begun
        self.peak = dict.fromkeys(names, 0)
        self.memory_log = {u: ([0.0], [0]) for u in names}
        self.on_device: dict = {u: set() for u in names}
        self.pins: dict = defaultdict(int)
        self.last_use: dict = {}
        self._freed: list = []

    def state(self, d: int, u: str) -> str | None:
        """The state of the copy of ``d`` on ``u`` (None: no copy)."""
        return self.copies[d].get(u)

    def room(self, u: str) -> float:
        """Bytes ``u`` may still take (inf: unlimited)."""
        cap = self.cap[u]
        return math.inf if cap is None else cap - self.held[u] - self.reserved[u]

    def touch(self, d: int, u: str, when: float) -> None:
        """``d`` was used on ``u`` at ``when`` (eviction prefers what was used longest
        ago)."""
        self.last_use[d, u] = when

    def add_copy(self, d: int, u: str, state: str) -> None:
        self.copies[d][u] = state
        self.on_device[u].add(d)
        self.grow(u, self.layout.size[d], data=True)

    def free_copy(self, d: int, u: str) -> None:
        del self.copies[d][u]
        self.on_device[u].discard(d)
        self._freed.append((d, u))
        self.grow(u, -self.layout.size[d], data=True)

    def free_all(self, d: int) -> None:
        for v, state in list(self.copies[d].items()):
            if state != "leaving":  # an offload under way: freed when it ends
                self.free_copy(d, v)
        if self.on_host[d]:
            self.on_host[d] = False
            self._freed.append((d, HOST))

    def offload_ended(self, d: int, u: str) -> None:
        """The offload of ``d`` from ``u`` ended: the device copy is freed; the host copy
        is kept unless the datum's last reader ended meanwhile (then it is freed too)."""
        self.free_copy(d, u)
        if self.left[d]:
            self.on_host[d] = True
        else:
            self._freed.append((d, HOST))

    def grow(self, u: str, nbytes: int, data: bool = False) -> None:
        """``u`` holds ``nbytes`` more (a datum's copy, else an extra: temporaries)."""
        if not nbytes:
            return
        self.held[u] += nbytes
        if not data:
            self.extra[u] += nbytes
        times, levels = self.memory_log[u]
        now = self._clock()
        if times[-1] == now:
            levels[-1] = self.held[u]
        else:
            times.append(now)
            levels.append(self.held[u])
        self.peak[u] = max(self.peak[u], self.held[u])

    def task_ended(self, t: int, u: str, rebuilt: tuple[int, ...], now: float) -> None:
        """Task ``t`` ended on ``u`` at ``now`` having recomputed ``rebuilt``: its
        outputs are present, its extras released, what no task reads again freed."""
        lay = self.layout
        for d in (*lay.writes[t], *rebuilt):
            if self.copies[d].get(u) == "pending":
                self.copies[d][u] = "present"
            self.touch(d, u, now)
        self.grow(u, -self.extra[u])
        for d in lay.reads[t]:
            self.left[d] -= 1
            self.touch(d, u, now)
            if self.left[d] == 0:
                self.free_all(d)
        for d in lay.writes[t]:
            if self.left[d] == 0 and lay.kind[d] not in PINNED:
                self.free_all(d)  # read by no task

    def take_freed(self) -> list:
        """Copies freed since the last call: (datum, device or ``HOST``)."""
        out, self._freed = self._freed, []
        return out
