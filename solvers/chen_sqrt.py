"""``chen_sqrt``: Chen et al. (2016), "Training deep nets with sublinear memory cost".

The chain (stages 0..L, the loss being the last) is cut into k segments of equal
length; the forward pass stores only the segment inputs (``F_ck`` at a boundary,
``F_n`` inside), and each segment is recomputed once, recording, before its
backward. k = sqrt(L + 1) gives O(sqrt L) memory for one extra forward.

Given a budget, every k from 1 to L + 1 is simulated and the fastest segmentation
that fits is returned (``meta["segments"]``), the budget-aware variant of the paper's
Algorithm 2. ``segments=k`` forces one.
"""

from __future__ import annotations

import math

from schedir import Chain, Schedule, simulate_chain
from solvers._chain_tree import Record, Split, tree_ops
from solvers.registry import Infeasible, register


def segment_starts(L: int, segments: int) -> list[int]:
    """First stage of each of ``segments`` equal segments of stages 0..L."""
    n = L + 1
    return sorted({round(q * n / segments) for q in range(segments)})


def chen_ops(chain: Chain, segments: int) -> tuple:
    """Ops of the Chen schedule with ``segments`` equal segments."""
    starts = segment_starts(chain.length, segments)

    def choose(i: int, t: int, _):
        after = [b for b in starts if i < b <= t]
        return Split(after[0]) if after else Record()

    return tree_ops(chain.length, choose)


@register(
    "chen_sqrt",
    problem=Chain,
    exact=False,
    description="Chen et al. 2016: store segment inputs, recompute each segment once",
)
def chen_sqrt(chain: Chain, budget: int, *, segments: int | None = None) -> Schedule:
    n = chain.length + 1
    if segments is not None and not (isinstance(segments, int) and 1 <= segments <= n):
        raise ValueError(f"chen_sqrt: segments = {segments!r}, expected an int in 1..{n}")
    candidates = [segments] if segments is not None else range(1, n + 1)
    best, least = None, math.inf
    for k in candidates:
        ops = chen_ops(chain, k)
        trace = simulate_chain(chain, ops)
        least = min(least, trace.peak_memory)
        if trace.peak_memory <= budget and (best is None or trace.makespan < best[0]):
            best = (trace.makespan, k, ops)
    if best is None:
        raise Infeasible("chen_sqrt", budget, int(least))
    _, k, ops = best
    return Schedule(ops, {"segments": k, "sqrt_segments": round(math.sqrt(n))})
