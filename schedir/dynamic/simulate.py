"""The simulator in which dynamic policies place tasks at run time.

:func:`simulate_dynamic` runs a task graph on a Platform the way a StarPU-like runtime
does (Augonnet et al., "StarPU: a unified platform for task scheduling on
heterogeneous multicore architectures", CCPE 2011); the rules (placement, admission,
eviction, transfers, freeing) are those of :class:`schedir.dynamic.runtime.RuntimeState`,
which the JAX runtime drives as well. The simulator adds the clock:

- a transfer takes ``link.time(bytes)`` on its directed link, a serial resource
  (FIFO); moves to and from the host use ``platform.prefetch`` / ``platform.offload``,
  one engine per device and direction (untimed for the initial copy of parameters and
  inputs when the platform has no host link);
- an offload ends before the task that asked for the room begins; the task starts
  computing once its inputs are on its device;
- its compute time is ``work / speed`` times the task's noise factor times its
  device's factor (:func:`task_factors`, :class:`schedir.pipeline.simulate.Noise`);
  recomputing a dropped datum adds its producer's time, with the same factors.

Items (e.g. pipeline inputs) enter through a window: the tasks of item n are not
released before item n - ``window`` is complete (a bounded stream; None: all at once).
"""

from __future__ import annotations

import heapq
import itertools

from schedir.dynamic.graph import TaskGraph
from schedir.dynamic.runtime import RuntimeState
from schedir.dynamic.trace import DynamicTrace
from schedir.pipeline.simulate import Noise
from schedir.platform import Platform


def task_factors(noise: Noise | None, count: int) -> list[float]:
    """The noise factor of each of ``count`` tasks, drawn in task order from the
    noise's generator (so a run's factors do not depend on the order tasks start in,
    and the simulator and the JAX runtime draw the same ones)."""
    noise = noise or Noise()
    rng = noise.generator()
    return [noise.factor(rng) for _ in range(count)]


def simulate_dynamic(
    graph: TaskGraph,
    platform: Platform,
    policy,
    *,
    noise: Noise | None = None,
    window: int | None = None,
    memory: dict | None = None,
    prefetch: bool = True,
) -> DynamicTrace:
    """Run ``graph`` under ``policy`` (see the module docstring); deterministic per seed.

    ``memory``: device name -> bytes it may hold, in place of the devices' own
    ``memory``. ``prefetch``: move a task's inputs when it is placed (if they fit),
    not only when its device admits it (the JAX runtime moves them at admission).
    """
    now = [0.0]
    state = RuntimeState(graph, platform, policy, clock=lambda: now[0], window=window,
                         memory=memory, prefetch=prefetch)  # fmt: skip
    factors = task_factors(noise, len(graph.tasks))
    dev_factor = (noise or Noise()).device_factors(state.names)
    events: list = []
    seq = itertools.count()
    waiting: dict = {u: None for u in state.names}  # plan's data not yet on the device
    offloads: dict = dict.fromkeys(state.names, 0)
    plans: dict = {}

    def transfer(d: int, src: str, dst: str) -> None:
        end = state.book_transfer(d, src, dst)
        heapq.heappush(events, (end, next(seq), "arrive", (d, src, dst)))

    def drain() -> None:
        for d, src, dst in state.take_transfers():
            transfer(d, src, dst)

    def compute(u: str) -> None:
        plan = plans[u]
        t = plan.task
        waiting[u] = None
        state.started(t)
        f = factors[t] * dev_factor[u]
        seconds = state.nominal(t, u) * f
        extra = state.recompute_work(plan) * f
        heapq.heappush(events, (now[0] + extra + seconds, next(seq), "end", (t, seconds, extra)))

    def begin(u: str) -> None:
        plan = plans[u]
        state.begin(plan)
        waiting[u] = {("fetch", d, src) for d, src in plan.fetch}
        waiting[u].update(("wait", d) for d in plan.wait if not state.present(d, u))
        for d, src in plan.fetch:
            transfer(d, src, u)
        if not waiting[u]:
            compute(u)

    def admit(u: str) -> None:
        plan = state.next_plan(u)
        if plan is None:
            return
        plans[u] = plan
        for d, mode in plan.evict:
            if mode == "offload":
                end = state.book_offload(d, u)
                offloads[u] += 1
                heapq.heappush(events, (end, next(seq), "offloaded", (d, u)))
        if not offloads[u]:
            begin(u)

    state.start_run()
    drain()
    while True:
        for u in state.names:
            if state.idle(u):
                admit(u)
        drain()
        if not events:
            break
        now[0], _, kind, what = heapq.heappop(events)
        if kind == "offloaded":
            d, u = what
            state.offloaded(d, u)
            offloads[u] -= 1
            if not offloads[u]:
                begin(u)
        elif kind == "arrive":
            d, src, dst = what
            state.arrived(d, dst, src)
            w = waiting[dst]
            if w is not None:
                w.discard(("fetch", d, src))
                if state.present(d, dst):
                    w.discard(("wait", d))
                if not w:
                    compute(dst)
        else:
            t, seconds, extra = what
            state.finished(t, seconds, extra)
        drain()
    state.check_done()
    return state.trace()
