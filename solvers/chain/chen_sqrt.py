"""``chen_sqrt``: Chen et al. (2016), "Training deep nets with sublinear memory cost".

The chain (stages 0..L, the loss being the last) is cut into k segments of equal
length; the forward pass stores only the segment inputs (``F_ck`` at a boundary,
``F_n`` inside), and each segment is recomputed once, recording, before its
backward. k = sqrt(L + 1) gives O(sqrt L) memory for one extra forward.

Given a budget, every k from 1 to L + 1 is evaluated and the fastest segmentation
that fits is returned (``meta["segments"]``; ties: the fewest segments), the
budget-aware variant of the paper's Algorithm 2. ``segments=k`` forces one.

Each k is evaluated in closed form (:func:`chen_cost`, O(L) numpy, equal to the
simulator's makespan and peak, tested), so all of them cost O(L^2) element
operations and the ops of the chosen one are emitted once.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from schedir import Chain, Schedule
from solvers.chain._tree import Record, Split, tree_ops
from solvers.registry import Infeasible, register


def segment_starts(L: int, segments: int) -> list[int]:
    """First stage of each of ``segments`` equal segments of stages 0..L: round(q n / k)
    for q < k (n = L + 1; numpy rounds halves to even, like Python's round)."""
    n = L + 1
    starts = np.round(np.arange(segments, dtype=np.int64) * n / segments).astype(np.int64)
    return np.unique(starts).tolist()


def chen_ops(chain: Chain, segments: int) -> tuple:
    """Ops of the Chen schedule with ``segments`` equal segments."""
    starts = segment_starts(chain.length, segments)

    def choose(i: int, t: int, _):
        q = bisect.bisect_right(starts, i)  # the first start after i
        return Split(starts[q]) if q < len(starts) and starts[q] <= t else Record()

    return tree_ops(chain.length, choose)


class _Arrays:
    """The chain's sizes as int64 arrays, with x_{L+1} = 0 and the loss's saved size
    and forward temporary as 0 (the simulator's ``Loss`` holds neither)."""

    def __init__(self, chain: Chain):
        L = chain.length
        self.L = L
        self.x = np.asarray(chain.in_size + (0,), dtype=np.int64)
        self.s = np.asarray(chain.saved_size[:L] + (0,), dtype=np.int64)
        self.ftmp = np.asarray(chain.fwd_tmp[:L] + (0,), dtype=np.int64)
        self.btmp = np.asarray(chain.bwd_tmp, dtype=np.int64)
        self.scum = np.concatenate([[0], np.cumsum(self.s)])
        self.prefix = np.concatenate([[0.0], np.cumsum(chain.fwd_time)])
        self.store_all = chain.store_all_time()


def chen_cost(chain: Chain, segments: int, arrays: _Arrays | None = None) -> tuple[float, int]:
    """(makespan, peak) of :func:`chen_ops`, from the schedule's three phases.

    Segment p covers stages b_p..b_{p+1}-1; checkpoints a[b_0..b_p] (CK_p bytes) are
    resident while it runs. (1) The forward sweep of segments 0..q-2: F_ck(b_p) holds
    CK_p + x_{b_p+1} + ftmp, F_n(k) CK_p + x_k + x_{k+1} + ftmp. (2), (3) Every segment,
    the last first, records and runs its backward with d[b_{p+1}] resident: F_all(k)
    holds CK_p + x_{b_{p+1}} + s_{b_p..k} + ftmp_k, B(k) (Loss for k = L)
    CK_p + s_{b_p..k} + x_{k+1} + x_k + btmp_k.
    """
    a = arrays or _Arrays(chain)
    L, x = a.L, a.x
    starts = np.asarray(segment_starts(L, segments))
    q = len(starts)
    stage = np.arange(L + 1)
    seg = np.searchsorted(starts, stage, side="right") - 1
    checkpoints = np.cumsum(x[starts])[seg]
    begin = starts[seg]
    nxt = np.append(starts[1:], L + 1)[seg]  # b_{p+1}; x[L+1] = 0 for the last segment
    held = a.scum[stage + 1] - a.scum[begin]
    record = checkpoints + x[nxt] + held + a.ftmp
    backward = checkpoints + held + x[stage + 1] + x[stage] + a.btmp
    peak = max(int(x[0]), int(record[:L].max(initial=0)), int(backward.max()))
    if q >= 2:  # the forward sweep of every segment but the last
        sweep = stage < starts[-1]
        running = np.where(stage == begin, 0, x[stage])
        forward = checkpoints + running + x[stage + 1] + a.ftmp
        peak = max(peak, int(forward[sweep].max()))
    makespan = a.store_all + float(a.prefix[starts[-1]])
    return makespan, peak


@register(
    "chen_sqrt",
    problem=Chain,
    exact=False,
    description="Chen et al. 2016: store segment inputs, recompute each segment once",
)
def chen_sqrt(chain: Chain, budget: int, *, segments: int | None = None, progress=None) -> Schedule:
    n = chain.length + 1
    if segments is not None and not (
        isinstance(segments, int) and not isinstance(segments, bool) and 1 <= segments <= n
    ):
        raise ValueError(f"chen_sqrt: segments = {segments!r}, expected an int in 1..{n}")
    candidates = [segments] if segments is not None else range(1, n + 1)
    arrays = _Arrays(chain)
    best, least = None, math.inf
    for count, k in enumerate(candidates):
        makespan, peak = chen_cost(chain, k, arrays)
        least = min(least, peak)
        if peak <= budget and (best is None or makespan < best[0]):
            best = (makespan, k)
        if progress is not None and count % 64 == 0:
            progress(count / len(candidates), f"{k} segments of {n}")
    if best is None:
        raise Infeasible("chen_sqrt", budget, int(least))
    _, k = best
    return Schedule(
        chen_ops(chain, k), {"segments": k, "sqrt_segments": round(math.sqrt(n)), "exact": False}
    )
