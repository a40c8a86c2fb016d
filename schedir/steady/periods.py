"""The period model of interval mappings: period, latency, memory (docs/pipelines.md).

What a mapping of a :class:`~schedir.pipeline.problem.PipelineProblem` (a Chain cut
into consecutive intervals, each placed on one device or replicated on several,
round-robin, which keeps outputs in order) achieves in steady state
(:func:`evaluate`; the 1F1B :func:`training_period`) and the per-device memory bound
(:func:`buffer_counts`, :func:`mapping_memory`). The discrete-event simulator
(:mod:`schedir.pipeline.simulate`) reproduces these figures at zero noise:

- interval [i, j) on replicas R (a_i in, a_j out) with work W = sum fwd_time[i:j]:
  period max_{u in R} (W / speed_u) / |R|;
- boundary j between intervals on R and R': each directed link (u, v) is a serial
  resource; item n goes from R[n mod |R|] to R'[n mod |R'|], so every used pair carries
  one item out of lcm(|R|, |R'|), each taking latency + x_j / bandwidth. Its period is
  max over used pairs of that time / lcm(|R|, |R'|);
- period of the mapping = the max of these; latency = sum along the path of the
  slowest replica's time and the slowest used link's time.

References: Subhlok and Vondran (SPAA 1996) and Benoit and Robert (JPDC 2008) for
interval mappings with replication.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.pipeline.problem import (
    Interval,
    Mapping,
    PipelineProblem,
    capacity,
    link_time,
    working_set,
)


def used_pairs(left: Sequence[str], right: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (sender, receiver) used by round-robin on both sides: one item each per lcm."""
    a, b = len(left), len(right)
    return sorted({(left[n % a], right[n % b]) for n in range(math.lcm(a, b))})


@dataclass(frozen=True)
class PeriodReport:
    """The analytical model of one mapping.

    Attributes:
        period: seconds per item in steady state (max of all resource periods).
        latency: seconds one item takes through an empty pipeline (slowest path).
        compute: period of each interval, seconds.
        links: period of each boundary between consecutive intervals, seconds.
        memory: bytes needed on each device (:func:`mapping_memory`), an upper bound
            of the simulated peak when items are released at the period.
        fits: whether every device's memory (and the budget, if given) holds it.
    """

    period: float
    latency: float
    compute: tuple[float, ...]
    links: tuple[float, ...]
    memory: dict
    fits: bool


def interval_memory(
    problem: PipelineProblem, i: int, j: int, inputs: int = 2, outputs: int = 2
) -> int:
    """Bytes one replica of inference interval [i, j) needs when it holds at most
    ``inputs`` copies of a_i and ``outputs`` copies of a_j at once: its weights, the
    op's working set, ``inputs`` x_i (x_0 once: the source hands it over when the op
    starts) and ``outputs`` x_j (none when j == L: the last output leaves at once).
    The counts of a mapping come from :func:`buffer_counts` (2 and 2 without
    replication)."""
    L, x = problem.length, problem.chain.in_size
    held_in = (inputs if i > 0 else 1) * x[i]
    held_out = outputs * x[j] if j < L else 0
    return sum(problem.weights[i:j]) + working_set(problem, i, j) + held_in + held_out


def _spread(times: Sequence[float]) -> float:
    """1 - min / max of non-negative times (0 when all are 0; 1 when one is infinite)."""
    lo, hi = min(times), max(times)
    if hi == 0:
        return 0.0
    return 1.0 if math.isinf(hi) else 1.0 - lo / hi


def _ceil(value: float) -> int:
    """ceil of a non-negative ratio of float sums, forgiving rounding (1e-9)."""
    return max(0, math.ceil(value - 1e-9))


def buffer_counts(
    problem: PipelineProblem, intervals: Sequence[Interval], next_replicas: int | None = None
) -> list[tuple[int, int]]:
    """(copies of a_i, copies of a_j) a replica of each interval may hold at once when
    items are released at the period T (docs/pipelines.md, "Memory").

    Replica v of interval g (r_g replicas) gets one item every r_g T; an item's input
    lives from the start of its transfer to the end of the op, its output from the
    start of the op to the end of its send. Every resource serves its items in order
    at most as slowly as the period allows (an interval's replica within r T, a link
    within lcm(r, r') T), so an item reaches each point at most the slowest path's
    time after its release and at least the fastest path's time. The number of an
    interval's items alive at once is then at most ceil(spread / (r_g T)), where the
    spread is the difference of those two times: the transfer (at most lcm T, i.e.
    f_in = r_{g-1} / gcd(r_{g-1}, r_g) items; the senders feeding one replica) plus
    the op (at most r_g T, one item) plus, for every upstream interval h whose
    replicas differ in speed, r_h T (1 - s_min / s_max), and for every upstream
    boundary whose links differ, lcm T (1 - t_min / t_max) over all pairs. Without
    replication every count is 2, as when the input in use and the next one being
    received are held.

    ``intervals`` may stop before stage L (a prefix being built); the interval after
    it then has ``next_replicas`` replicas.
    """
    L, x = problem.length, problem.chain.in_size
    plat = problem.platform
    reps = [len(iv.devices) for iv in intervals]
    counts = []
    h_in = h_out = 0.0  # upstream heterogeneity, in units of T
    for g, iv in enumerate(intervals):
        r = reps[g]
        if g == 0:
            n_in = 1
        else:
            n_in = reps[g - 1] // math.gcd(reps[g - 1], r) + 1 + _ceil(h_in / r)
        if iv.last == L:
            n_out = 0
        else:
            nxt = reps[g + 1] if g + 1 < len(intervals) else next_replicas
            if nxt is None:
                raise ValueError("buffer_counts: a prefix needs next_replicas")
            n_out = nxt // math.gcd(r, nxt) + 1 + _ceil(h_out / r)
        counts.append((n_in, n_out))
        # what interval g adds to the spread of the intervals after it
        speeds = [plat.device(u).speed for u in iv.devices]
        h_compute = r * (1.0 - min(speeds) / max(speeds))
        h_link = 0.0
        if g + 1 < len(intervals):
            nxt_devs = intervals[g + 1].devices
            times = [link_time(problem, u, v, x[iv.last]) for u in iv.devices for v in nxt_devs]
            h_link = math.lcm(r, len(nxt_devs)) * _spread(times)
        h_in = h_out + h_compute
        h_out = h_out + h_compute + h_link
    return counts


def mapping_memory(
    problem: PipelineProblem, intervals: Sequence[Interval], next_replicas: int | None = None
) -> list[int]:
    """Bytes a replica of each interval needs (:func:`interval_memory` with the counts
    of :func:`buffer_counts`); an upper bound of the simulator's peak at the period."""
    counts = buffer_counts(problem, intervals, next_replicas)
    return [interval_memory(problem, iv.first, iv.last, *c)
            for iv, c in zip(intervals, counts, strict=True)]  # fmt: skip


def boundary_period(
    problem: PipelineProblem, k: int, left: Sequence[str], right: Sequence[str], pairs: str = "used"
) -> tuple[float, float]:
    """(period, one-item time) of the links carrying a_k from replicas ``left`` to ``right``.

    ``pairs="used"`` takes the pairs round-robin really uses (exact for this order);
    ``pairs="all"`` takes every pair of left x right (an order-free upper bound, equal
    to "used" when gcd(|left|, |right|) = 1 or links are identical).
    """
    nbytes = problem.chain.in_size[k]
    chosen = used_pairs(left, right) if pairs == "used" else list(itertools.product(left, right))
    worst = max(link_time(problem, u, v, nbytes) for u, v in chosen)
    return worst / math.lcm(len(left), len(right)), worst


def evaluate(
    problem: PipelineProblem, mapping: Mapping, pairs: str = "used", budget: int | None = None
) -> PeriodReport:
    """Period, latency and memory of ``mapping`` by the model of docs/pipelines.md;
    ``budget`` (bytes), if given, bounds every device as well as its own memory."""
    mapping.check(problem)
    ivs = mapping.intervals
    compute, slowest = [], []
    memory, fits = {}, True
    for iv, need in zip(ivs, mapping_memory(problem, ivs), strict=True):
        w = problem.work(iv.first, iv.last)
        t = max(w / problem.platform.device(u).speed for u in iv.devices)
        compute.append(t / len(iv.devices))
        slowest.append(t)
        for u in iv.devices:
            memory[u] = need
            cap = capacity(problem, u, budget)
            fits = fits and (cap is None or need <= cap)
    links, hops = [], []
    for a, b in itertools.pairwise(ivs):
        period, one = boundary_period(problem, a.last, a.devices, b.devices, pairs)
        links.append(period)
        hops.append(one)
    period = max(compute + links)
    return PeriodReport(
        period, sum(slowest) + sum(hops), tuple(compute), tuple(links), memory, fits
    )


def training_period(
    problem: PipelineProblem, mapping: Mapping, recompute: Sequence[float] | None = None
) -> float:
    """Steady-state seconds per micro-batch of 1F1B on a mapping without replication.

    Stage p (device u_p) takes c_p = (work + recompute_p) / speed per micro-batch;
    the forward link p -> p+1 carries a_j and the backward link carries d_j, each
    taking f_p and b_p. Stage p keeps P - p micro-batches in flight, so the forward of
    micro-batch n + P - p waits for the backward of n, which waits for the round trip
    below it. Every run of stages p..q forms a cycle (forward down, backward up) over
    q - p + 1 micro-batches, so the period is the largest cycle mean:

        max( max_p f_p, max_p b_p,
             max_{p <= q} [sum_{p <= r <= q} c_r + sum_{p <= r < q} (f_r + b_r)] / (q - p + 1) )

    (p == q gives c_p). Without communication this is max_p c_p (docs/pipelines.md).
    """
    ivs = mapping.intervals
    P = len(ivs)
    rec = list(recompute or [0.0] * P)
    devs = [iv.devices[0] for iv in ivs]
    c = [
        (problem.work(iv.first, iv.last) + rec[p]) / problem.platform.device(devs[p]).speed
        for p, iv in enumerate(ivs)
    ]
    x = problem.chain.in_size
    f = [link_time(problem, devs[p], devs[p + 1], x[ivs[p].last]) for p in range(P - 1)]
    b = [link_time(problem, devs[p + 1], devs[p], x[ivs[p].last]) for p in range(P - 1)]
    cycles = [
        (sum(c[p : q + 1]) + sum(f[p:q]) + sum(b[p:q])) / (q - p + 1)
        for p in range(P)
        for q in range(p, P)
    ]
    return max(f + b + cycles)
