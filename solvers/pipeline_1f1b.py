"""Training pipelines with a 1F1B schedule and per-stage checkpointing (``"pipeline_1f1b"``).

The chain is cut into S <= P intervals placed on S distinct devices in a chosen order
(no replication). With ``m`` micro-batches, stage p (0-based) keeps the activations of
up to n_p = min(S - p, m) micro-batches in flight (PipeDream-Flush / 1F1B; Narayanan
et al., SC 2021). Memory model of a stage on device u (documented in
``docs/pipelines.md``): its weights, and for each in-flight micro-batch an equal share
b_p = floor((memory_u - weights) / n_p) of the rest. One micro-batch's forward and
backward of the interval (a sub-chain whose loss is "receive d_j", or the real loss on
the last stage) must fit in b_p: if store-all fits, it costs its forward + backward;
otherwise the exact chain DP (rotor, :mod:`solvers.rotor`) gives the least time in b_p
bytes and the difference is recompute time; below rotor's least memory the stage is
infeasible. This is conservative (every micro-batch reserves its whole peak).

The period is :func:`schedir.pipeline.training_period` (1F1B's cycle means, with
communication); the solver enumerates the number of stages, the device orders and
the cut points (exhaustive, cached per interval and budget), so it is exact for this
model; ``max_candidates`` bounds the enumeration on large instances.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

from schedir import Chain
from schedir.pipeline import (
    Interval,
    Mapping,
    PipelineProblem,
    compositions,
    link_time,
    training_period,
)
from schedir.pipeline_ops import PipelineSchedule, one_f_one_b_ops
from solvers.registry import Infeasible, register
from solvers.rotor import min_memory


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


class StageCosts:
    """Cached (time at speed 1, recompute, per-micro-batch bytes) of an interval."""

    def __init__(self, problem: PipelineProblem, slots: int = 500):
        self.problem, self.slots = problem, slots

        @cache
        def cost(i: int, j: int, budget: float) -> tuple[float, float, int] | None:
            import schedir
            import solvers
            from solvers.store_all import store_all_ops

            sub = sub_chain(problem.chain, i, j)
            base = sub.store_all_time()
            peak = schedir.simulate(sub, store_all_ops(sub)).peak_memory
            if budget >= peak:
                return base, 0.0, peak
            b = int(budget)
            if b < min_memory(sub):
                return None
            try:
                s = solvers.solve(sub, b, "rotor", slots=slots)
            except solvers.Infeasible:
                return None
            return s.meta["makespan"], s.meta["makespan"] - base, s.meta["peak_memory"]

        self.cost = cost

    def stage(self, i: int, j: int, device, inflight: int):
        """(seconds on ``device``, recompute seconds at speed 1, bytes per micro-batch)."""
        w = sum(self.problem.weights[i:j])
        cap = math.inf if device.memory is None else device.memory - w
        if cap < 0:
            return None
        share = cap / inflight if math.isfinite(cap) else math.inf
        got = self.cost(i, j, math.floor(share) if math.isfinite(share) else math.inf)
        if got is None:
            return None
        t, rec, per_mb = got
        return t / device.speed, rec, per_mb


def best_1f1b(problem: PipelineProblem, max_candidates: int = 200_000, slots: int = 500):
    """(period, mapping, recompute per stage, bytes per micro-batch per stage)."""
    if not problem.training:
        raise ValueError("pipeline_1f1b needs a training problem (training=True)")
    L, m = problem.length, problem.microbatches
    devs = problem.platform.devices
    costs = StageCosts(problem, slots)
    x = problem.chain.in_size
    best = (math.inf, None, None, None)
    seen = 0
    for S in range(1, min(len(devs), L) + 1):
        for order in itertools.permutations(devs, S):
            for cuts in compositions(L, S):
                seen += 1
                if seen > max_candidates:
                    break
                stages = []
                for p in range(S):
                    got = costs.stage(cuts[p], cuts[p + 1], order[p], min(S - p, m))
                    if got is None:
                        break
                    stages.append(got)
                else:
                    c = [s[0] for s in stages]
                    f = [link_time(problem, order[p].name, order[p + 1].name, x[cuts[p + 1]])
                         for p in range(S - 1)]  # fmt: skip
                    b = [link_time(problem, order[p + 1].name, order[p].name, x[cuts[p + 1]])
                         for p in range(S - 1)]  # fmt: skip
                    bound = max(c + f + b)
                    if bound >= best[0]:
                        continue
                    mapping = Mapping(tuple(
                        Interval(cuts[p], cuts[p + 1], (order[p].name,)) for p in range(S)
                    ))  # fmt: skip
                    rec = [s[1] for s in stages]
                    period = training_period(problem, mapping, rec)
                    if period < best[0] - 1e-15:
                        best = (period, mapping, rec, [s[2] for s in stages])
    if best[1] is None:
        raise Infeasible("pipeline_1f1b", 0, None, "no stage split fits the devices' memory")
    return best


@register(
    "pipeline_1f1b",
    problem=PipelineProblem,
    exact=True,
    description="1F1B training pipeline, rotor per stage when memory is short, least period",
)
def pipeline_1f1b(
    problem: PipelineProblem, budget: int = 0, *, max_candidates: int = 200_000, slots: int = 500
) -> PipelineSchedule:
    """``budget`` is unused: the memory limits are the devices' capacities."""
    period, mapping, rec, per_mb = best_1f1b(problem, max_candidates, slots)
    s = one_f_one_b_ops(problem, mapping, rec)
    stash = {
        f"{iv.first}:{iv.last}": int(b) for iv, b in zip(mapping.intervals, per_mb, strict=True)
    }
    meta = {**s.meta, "method": "pipeline_1f1b", "period": period, "recompute": rec,
            "stash": stash, "microbatches": problem.microbatches}  # fmt: skip
    return PipelineSchedule(s.ops, meta)
