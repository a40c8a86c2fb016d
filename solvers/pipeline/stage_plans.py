"""What one micro-batch of a chunk costs under a per-micro-batch memory budget.

A chunk [i, j) of a training pipeline is planned as a chain of its own
(:func:`sub_chain`: its loss is the arrival of d_j, or the real loss on the last
chunk). Under a budget of b bytes per micro-batch it runs one of (:class:`Plan`):

- ``store_all``: its forward and backward, holding the store-all peak (simulated);
- ``rotor``: rotor's optimal rematerialization under b (``solvers.chain.rotor``);
  the extra seconds are recomputation;
- ``offload``: rotor_offload's remat + activation offload under b, when the platform
  has a host link (``platform.offload`` / ``prefetch`` of non-zero bandwidth, one
  copy engine per device and direction); the extra seconds are recomputation and the
  compute stream's waits for copies.

A pipeline schedule carries a plan as the chunk's footprint (``meta["stash"]``, held
from its forward's start to its backward's end, :func:`schedir.pipeline.ops.effect`)
and its extra seconds as ``Bwd.recompute`` (speed 1). The plan of a chunk is computed
on the chunk alone: its copies do not contend with other micro-batches' (one op at
a time runs on a device) and host memory is split evenly among the micro-batches in
flight of all devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from schedir import Chain
from schedir.pipeline.problem import PipelineProblem
from schedir.platform import Platform


def sub_chain(chain: Chain, i: int, j: int) -> Chain:
    """Stages i..j-1 as a chain; its loss is the real loss if j == L, else the arrival
    of d_j (no time, x_j bytes)."""
    L = chain.length
    if j == L:
        tail = (chain.fwd_time[L], chain.bwd_time[L], chain.in_size[L], 0, 0, chain.bwd_tmp[L])
    else:
        tail = (0.0, 0.0, chain.in_size[j], 0, 0, 0)
    return Chain(
        fwd_time=(*chain.fwd_time[i:j], tail[0]),
        bwd_time=(*chain.bwd_time[i:j], tail[1]),
        in_size=(*chain.in_size[i:j], tail[2]),
        saved_size=(*chain.saved_size[i:j], tail[3]),
        fwd_tmp=(*chain.fwd_tmp[i:j], tail[4]),
        bwd_tmp=(*chain.bwd_tmp[i:j], tail[5]),
    )


@dataclass(frozen=True)
class Plan:
    """One micro-batch of a chunk: ``time`` (seconds at speed 1, forward + backward,
    the loss included on the last chunk), ``extra`` (seconds over store-all),
    ``footprint`` (bytes held per micro-batch), ``kind`` ("store_all", "rotor",
    "offload") and whether the chain solver's answer was ``exact``."""

    time: float
    extra: float
    footprint: int
    kind: str
    exact: bool = True


def has_host_link(platform: Platform) -> bool:
    return platform.offload.bandwidth > 0 and platform.prefetch.bandwidth > 0


class StagePlans:
    """Cached plans of the chunks of ``problem``; ``slots``: rotor's discretization."""

    def __init__(self, problem: PipelineProblem, slots: int = 500, offload: bool = True):
        self.problem, self.slots = problem, slots
        self.offload = offload and has_host_link(problem.platform)
        self.exact = True  # every chain answer used so far was exact
        self.plan = cache(self._plan)
        self.store_all = cache(self._store_all)
        self.least = cache(self._least)

    def _store_all(self, i: int, j: int) -> Plan:
        import schedir
        from solvers.chain.store_all import store_all_ops

        sub = sub_chain(self.problem.chain, i, j)
        peak = schedir.simulate(sub, store_all_ops(sub)).peak_memory
        return Plan(sub.store_all_time(), 0.0, int(peak), "store_all")

    def _least(self, i: int, j: int) -> int:
        """The least per-micro-batch bytes of any plan (rotor's least memory; offloading
        may go lower, which this bound ignores)."""
        from solvers.chain.rotor import min_memory

        return int(min_memory(sub_chain(self.problem.chain, i, j)))

    def _plan(self, i: int, j: int, budget: int, share_host: int = 1) -> Plan | None:
        """The fastest plan of chunk [i, j) within ``budget`` bytes per micro-batch
        (None if none fits); ``share_host``: micro-batches sharing the host memory."""
        import solvers

        base = self.store_all(i, j)
        if budget >= base.footprint:
            return base
        sub = sub_chain(self.problem.chain, i, j)
        best = None
        if budget >= self.least(i, j):
            try:
                s = solvers.solve(sub, budget, "rotor", slots=self.slots)
                ok = bool(s.meta.get("exact", False))
                best = Plan(s.meta["makespan"], s.meta["makespan"] - base.time,
                            int(s.meta["peak_memory"]), "rotor", ok)  # fmt: skip
            except solvers.Infeasible:
                best = None
        if self.offload:
            got = self._offload(sub, budget, base, share_host)
            if got is not None and (best is None or got.time < best.time):
                best = got
        if best is not None:
            self.exact = self.exact and best.exact
        return best

    def _offload(self, sub: Chain, budget: int, base: Plan, share_host: int) -> Plan | None:
        import schedir
        import solvers

        plat = self.problem.platform
        host = plat.host_memory
        host = None if host is None else host // max(1, share_host)
        off = schedir.OffloadProblem(sub, schedir.Platform(
            device_memory=budget, host_memory=host, offload=plat.offload,
            prefetch=plat.prefetch))  # fmt: skip
        try:
            s = solvers.solve(off, budget, "rotor_offload", slots=self.slots)
        except solvers.Infeasible:
            return None
        t = s.meta["makespan"]
        kind = "rotor" if s.meta.get("fallback") == "rotor" else "offload"
        return Plan(t, t - base.time, int(s.meta["peak_memory"]), kind,
                    bool(s.meta.get("exact", False)))  # fmt: skip

    def within(self, i: int, j: int, budget: float, share_host: int = 1) -> Plan | None:
        """:meth:`plan` for a real-valued budget (floored; inf: store-all)."""
        if math.isinf(budget):
            return self.store_all(i, j)
        if budget < 0:
            return None
        return self.plan(i, j, int(math.floor(budget)), share_host)
