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
infeasible. This is conservative (every micro-batch reserves its whole peak). The
schedule gives these peaks to the simulator as its chunks' footprints, which
adds inputs that arrive before their forward and gradients still being sent after
their backward; a candidate whose simulated peaks exceed a device is skipped, so
the returned schedule always passes the judge.

The period is :func:`schedir.steady.training_period` (1F1B's cycle means, with
communication); the solver enumerates the number of stages, the device orders and
the cut points (exhaustive, cached per interval and budget), so it is exact for this
model; ``max_candidates`` bounds the enumeration on large instances.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import cache

from schedir.pipeline.baselines import one_f_one_b_ops
from schedir.pipeline.problem import Interval, Mapping, PipelineProblem, capacity, link_time
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.simulate import simulate_pipeline
from schedir.steady import training_period
from solvers.pipeline.exhaustive import compositions
from solvers.pipeline.stage_plans import Plan, StagePlans, sub_chain  # noqa: F401 (re-exported)
from solvers.registry import Infeasible, register


def message_reserve(problem: PipelineProblem, i: int, j: int) -> int:
    """Bytes of one message of each kind around chunk [i, j) outside its footprint: a
    received a_i and a sent d_i (i > 0), a received d_j (j < L); with split
    backwards also the working set of a W (``Wgt``), which runs outside the footprint."""
    x, L = problem.chain.in_size, problem.length
    wgt = max(problem.chain.bwd_tmp[i:j]) if problem.wgrad_fraction is not None else 0
    return (2 * x[i] if i > 0 else 0) + (x[j] if j < L else 0) + wgt


@dataclass(frozen=True)
class StageCost:
    """A stage of 1F1B on its device: ``seconds`` per micro-batch there, and the
    ``plan`` of one micro-batch within its share of the device (its recompute seconds
    ``plan.extra`` at speed 1, its bytes per micro-batch ``plan.footprint``)."""

    seconds: float
    plan: Plan


@dataclass(frozen=True)
class StagedMapping:
    """The 1F1B mapping of least period: its ``period`` (seconds per micro-batch), the
    ``mapping`` and each stage's ``plans`` (store-all or rotor); ``exact`` is False
    when the enumeration was cut or a rotor answer was not exact (discretized)."""

    period: float
    mapping: Mapping
    plans: tuple[Plan, ...]
    exact: bool

    @property
    def recompute(self) -> list[float]:
        """Recompute seconds at speed 1 per micro-batch, per stage."""
        return [p.extra for p in self.plans]

    @property
    def footprints(self) -> list[int]:
        """Bytes per micro-batch, per stage."""
        return [p.footprint for p in self.plans]


class StageCosts:
    """Cached plans of an interval under a per-micro-batch budget: store-all, else
    rotor (:class:`solvers.pipeline.stage_plans.StagePlans`, no offloading)."""

    def __init__(self, problem: PipelineProblem, slots: int = 500):
        self.problem, self.slots = problem, slots
        self.plans = StagePlans(problem, slots, offload=False)
        self.cost = cache(self.plans.within)

    @property
    def exact(self) -> bool:
        """Whether every rotor answer used so far was exact."""
        return self.plans.exact

    def stage(self, i: int, j: int, device, inflight: int, budget: int | None = None):
        """The :class:`StageCost` of stages [i, j) on ``device`` with ``inflight``
        micro-batches sharing it (None: no plan fits).

        The shares leave room for the messages around the footprints: an input a_i
        arriving before its forward, a gradient d_j waiting for its backward and the
        gradient d_i being sent after it, which the simulator counts outside the
        footprints as an executor holds them (issue 15 reported a 7% overshoot without
        them; the schedules of the solver from before, re-simulated on the profiled
        chains at tight memory, peaked at 0.9997 of capacity at most: docs/pipelines.md,
        benchmarks/pipeline_tight_memory.py)."""
        w = sum(self.problem.weights[i:j]) + message_reserve(self.problem, i, j)
        limit = capacity(self.problem, device.name, budget)
        cap = math.inf if limit is None else limit - w
        if cap < 0:
            return None
        share = cap / inflight if math.isfinite(cap) else math.inf
        got = self.cost(i, j, math.floor(share) if math.isfinite(share) else math.inf)
        return None if got is None else StageCost(got.time / device.speed, got)


def best_1f1b(
    problem: PipelineProblem,
    max_candidates: int = 200_000,
    slots: int = 500,
    budget: int | None = None,
    progress=None,
) -> StagedMapping:
    """The 1F1B mapping of least period (:class:`StagedMapping`).

    Candidates are taken by increasing period; one whose schedule the simulator finds
    over a device's memory (the buffers in flight come on top of the shares) is
    skipped. Not exact when ``max_candidates`` cut the enumeration or a stage's rotor
    answer was not exact (discretized).
    """
    if not problem.training:
        raise ValueError("pipeline_1f1b needs a training problem (training=True)")
    L, m = problem.length, problem.microbatches
    devs = problem.platform.devices
    costs = StageCosts(problem, slots)
    x = problem.chain.in_size
    best: tuple = (math.inf, None, ())
    seen, complete = 0, True
    P = len(devs)
    total = sum(math.perm(P, S) * math.comb(L - 1, S - 1) for S in range(1, min(P, L) + 1))
    total = min(total, max_candidates)
    for S in range(1, min(len(devs), L) + 1):
        for order in itertools.permutations(devs, S):
            for cuts in compositions(L, S):
                seen += 1
                if seen > max_candidates:
                    complete = False
                    break
                if progress is not None and seen % 500 == 0:
                    progress(seen / total, f"pipeline_1f1b: {seen} of {total} candidates")
                stages = []
                for p in range(S):
                    got = costs.stage(cuts[p], cuts[p + 1], order[p], min(S - p, m), budget)
                    if got is None:
                        break
                    stages.append(got)
                else:
                    c = [s.seconds for s in stages]
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
                    rec = [s.plan.extra for s in stages]
                    period = training_period(problem, mapping, rec)
                    per_mb = [s.plan.footprint for s in stages]
                    if period < best[0] - 1e-15 and _fits(problem, mapping, rec, per_mb, budget):
                        best = (period, mapping, tuple(s.plan for s in stages))
    if best[1] is None:
        raise Infeasible("pipeline_1f1b", budget, None, "no stage split fits the devices' memory")
    return StagedMapping(*best, complete and costs.exact)


def _schedule(problem: PipelineProblem, mapping: Mapping, rec, per_mb) -> PipelineSchedule:
    """The 1F1B ops; every stage's plan reserves its per-micro-batch footprint (its
    store-all or rotor peak), which the simulator holds from the forward's start to
    the backward's end in place of its own accounting."""
    s = one_f_one_b_ops(problem, mapping, rec)
    return s.with_plans(dataclasses.replace(c, footprint=int(b))
                        for c, b in zip(s.plans, per_mb, strict=True))  # fmt: skip


def _fits(problem: PipelineProblem, mapping: Mapping, rec, per_mb, budget) -> bool:
    """Whether the simulated 1F1B schedule stays within every device's capacity."""
    trace = simulate_pipeline(problem, _schedule(problem, mapping, rec, per_mb))
    for dev, peak in trace.device_peak.items():
        cap = capacity(problem, dev, budget)
        if cap is not None and peak > cap:
            return False
    return True


@register(
    "pipeline_1f1b",
    problem=PipelineProblem,
    exact=True,
    description="1F1B training pipeline, rotor per stage when memory is short, least period",
)
def pipeline_1f1b(
    problem: PipelineProblem,
    budget: int | None = None,
    *,
    max_candidates: int = 200_000,
    slots: int = 500,
    progress=None,
) -> PipelineSchedule:
    """``budget`` (bytes, optional) bounds every device besides its own memory."""
    best = best_1f1b(problem, max_candidates, slots, budget, progress)
    s = _schedule(problem, best.mapping, best.recompute, best.footprints)
    plans = StagePlans(problem, slots, offload=False)
    meta = {**s.meta, "method": "pipeline_1f1b", "period": best.period,
            "recompute": best.recompute, "microbatches": problem.microbatches,
            "exact": best.exact}  # fmt: skip
    return dataclasses.replace(s.with_plans(plans.chunk_plans(s.plans, best.plans)), meta=meta)
