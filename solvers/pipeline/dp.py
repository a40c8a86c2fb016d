"""Exact DP for interval mapping with replication on identical devices (``"pipeline_dp"``).

Minimizes the period of docs/pipelines.md (``schedir.steady.evaluate``) of an inference
pipeline when every device has the same speed and memory and every pair of devices is
linked by the same link. A replica's memory depends on the replica counts of its
neighbours (``schedir.steady.buffer_counts``: the senders that feed it and the
receivers it feeds), so the state also holds the count of the interval that follows.
Let T(j, q, r, n) be the least period of stages 0..j-1 mapped on q devices with the
last interval replicated r times and the next one n times (n = 0 when j = L):

    T(j, r, r, n) = W(0, j) / (s r)                                 (first interval)
    T(j, q, r, n) = min_{i < j, r'} max( T(i, q - r, r', r), t(x_i) / lcm(r', r),
                                         W(i, j) / (s r) )

where W(i, j) is the work of stages i..j-1, s the speed, t(x_i) one transfer of a_i,
and interval [i, j) is allowed only if its memory (``interval_memory`` with the
counts of r', r, n) fits a device. On identical devices and links every item takes
equally long, so the counts depend on these neighbours only. The optimum is min over
q <= P and r of T(L, q, r, 0); O(L^2 P^4) time. This is the classical polynomial case
of interval mapping (Subhlok and Vondran, SPAA 1996; Benoit and Robert, JPDC 2008),
extended with the link term of round-robin replication and its buffers.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cache

from schedir import InvalidProblem
from schedir.pipeline.problem import Interval, Mapping, PipelineProblem, capacity
from schedir.steady import evaluate, inference_pattern, interval_memory
from solvers.registry import Infeasible, register


def check_identical(problem: PipelineProblem) -> tuple[float, int | None]:
    """(speed, memory) of the devices; InvalidProblem unless devices and links are identical."""
    devs = problem.platform.devices
    if len({d.speed for d in devs}) > 1 or len({d.memory for d in devs}) > 1:
        raise InvalidProblem("pipeline_dp needs identical devices; use pipeline_milp or greedy")
    links = {(lk.src, lk.dst): (lk.bandwidth, lk.latency) for lk in problem.platform.links}
    kinds = set(links.values())
    P = len(devs)
    if len(kinds) > 1 or (P > 1 and len(links) != P * (P - 1)):
        raise InvalidProblem("pipeline_dp needs identical links between every pair of devices")
    return devs[0].speed, devs[0].memory


def dp_mapping(
    problem: PipelineProblem, replicate: bool = True, budget: int | None = None
) -> tuple[float, Mapping]:
    """The optimal mapping and its period; raises Infeasible when no mapping fits
    (``budget``, bytes, bounds every device as well as its memory)."""
    speed, _ = check_identical(problem)
    L, P = problem.length, len(problem.platform.devices)
    names = [d.name for d in problem.platform.devices]
    memory = capacity(problem, names[0], budget)
    links = problem.platform.links
    one = links[0].time if links else (lambda nbytes: math.inf)
    x = problem.chain.in_size
    rmax = P if replicate else 1
    prefix = [0.0]
    for k in range(L):
        prefix.append(prefix[-1] + problem.work(k, k + 1))

    @cache
    def fits(i: int, j: int, before: int, r: int, after: int) -> bool:
        """Replicas of [i, j) (r of them, ``before`` / ``after`` in the neighbours) fit."""
        if memory is None:
            return True
        n_in = 1 if i == 0 else before // math.gcd(before, r) + 1
        n_out = 0 if j == L else after // math.gcd(r, after) + 1
        return interval_memory(problem, i, j, n_in, n_out) <= memory

    @cache
    def best(j: int, q: int, r: int, after: int) -> tuple[float, tuple]:
        """(period, ((i, r_interval), ...)) for stages 0..j-1 on q devices, last r."""
        result = (math.inf, ())
        for i in range(j):
            comp = (prefix[j] - prefix[i]) / (speed * r)
            if i == 0:
                if q == r and comp < result[0] and fits(0, j, 0, r, after):
                    result = (comp, ((0, r),))
                continue
            for r2 in range(1, min(rmax, q - r) + 1):
                if not fits(i, j, r2, r, after):
                    continue
                head, plan = best(i, q - r, r2, r)
                value = max(head, comp, one(x[i]) / math.lcm(r2, r))
                if value < result[0]:
                    result = (value, (*plan, (i, r)))
        return result

    top = (math.inf, ())
    for q in range(1, P + 1):
        for r in range(1, min(rmax, q) + 1):
            cand = best(L, q, r, 0)
            if cand[0] < top[0]:
                top = cand
    if math.isinf(top[0]):
        raise Infeasible("pipeline_dp", budget, None, "no mapping fits the devices' memory")
    cuts = [i for i, _ in top[1]] + [L]
    ivs, used = [], 0
    for g, (i, r) in enumerate(top[1]):
        ivs.append(Interval(i, cuts[g + 1], tuple(names[used : used + r])))
        used += r
    return top[0], Mapping(tuple(ivs))


def require_inference(problem: PipelineProblem, method: str) -> None:
    """Refuse a training problem: the interval-mapping model has no backward or stash."""
    if problem.training:
        raise NotImplementedError(
            f"{method} plans inference pipelines (training = false): its memory model has "
            "no backward pass and no stashed activations; for training use pipeline_1f1b"
        )


def mapping_schedule(problem: PipelineProblem, mapping: Mapping, method: str, **meta):
    """The periodic inference pattern of ``mapping`` with its model figures in meta."""
    rep = evaluate(problem, mapping)
    s = inference_pattern(problem, mapping)
    # a period of 0 (no work, free links) has no finite throughput: None, not inf in JSON
    meta = {**s.meta, "method": method, "period": rep.period, "latency": rep.latency,
            "throughput": 1 / rep.period if rep.period > 0 else None, **meta}  # fmt: skip
    return dataclasses.replace(s, meta=meta)


@register(
    "pipeline_dp",
    problem=PipelineProblem,
    exact=True,
    description="interval mapping with replication on identical devices, least period (DP)",
)
def pipeline_dp(problem: PipelineProblem, budget: int | None = None, *, replicate: bool = True):
    """``budget`` (bytes, optional) bounds every device besides its own memory."""
    require_inference(problem, "pipeline_dp")
    period, mapping = dp_mapping(problem, replicate, budget)
    return mapping_schedule(problem, mapping, "pipeline_dp", model_period=period, exact=True)
