"""``revolve``: Griewank's binomial checkpointing (Griewank & Walther, ACM TOMS 2000).

Optimal for homogeneous chains: reversing l steps with c checkpoints (the start one
included) needs the least number of forward advances

    A(1, c) = 0,  A(l, 1) = l (l - 1) / 2,
    A(l, c) = min over 1 <= j < l of  j + A(l - j, c - 1) + A(j, c),

which equals Griewank's closed form t(l, c) = r l - binom(c + r, r - 1) where r is the
least integer with binom(c + r, c) >= l. The L stages and the loss are l = L + 1
steps; a split advances from a checkpoint with ``F_ck F_n ...`` and each reverse step
is ``F_all(k) B(k)`` (revolve records a step right before reversing it, and never
stores residuals otherwise).

The first split j is read from the closed form (:func:`first_split`, O(r) integer
steps, no table): with beta(c, r) = binom(c + r, c), A(., c) increases by r on
(beta(c, r-1), beta(c, r)], so the cost of j is convex and its smallest minimizer is
j = beta(c, r-1) when l = beta(c, r), else max(beta(c, r-2), l - beta(c-1, r), 1)
(tested equal to the first minimizer of the recursion).

On heterogeneous chains the split points come from the unit costs, as revolve would
choose them; the true time and memory follow (``_chain_tree.TreeCost``, equal to the
simulator's). Given a budget, the largest c whose schedule fits is used
(``meta["checkpoints"]``): c is scanned downward from the largest whose lower bound
fits (at the loss, a_0, a_L, d_L and min(c, L) - 1 other checkpoints are resident).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from schedir import Chain, Schedule
from solvers.chain._tree import Split, TreeCost, tree_ops
from solvers.registry import Infeasible, register


def beta(c: int, r: int) -> int:
    """binom(c + r, c): the most steps c checkpoints reverse with r advances per step."""
    return math.comb(c + r, c) if r >= 0 else 0


def repetitions(steps: int, checkpoints: int) -> int:
    """The least r with beta(checkpoints, r) >= steps."""
    r, reach = 0, 1
    while reach < steps:
        r += 1
        reach = reach * (checkpoints + r) // r
    return r


def first_split(steps: int, checkpoints: int) -> int:
    """The smallest optimal first advance j of the recursion A (module doc), steps >= 2."""
    c = checkpoints
    if c == 1:
        return steps - 1  # only the last step can be reversed without a checkpoint
    r, older, old, reach = 0, 0, 0, 1  # reach = beta(c, r), old = beta(c, r-1), older
    while reach < steps:
        r += 1
        older, old, reach = old, reach, reach * (c + r) // r
    if steps == reach:
        return old
    # beta(c - 1, r) = beta(c, r) - beta(c, r - 1) (Pascal's rule)
    return max(older, steps - (reach - old), 1)


def griewank_advances(steps: int, checkpoints: int) -> int:
    """Griewank's closed form for the least number of forward advances."""
    if steps <= 1:
        return 0
    r = repetitions(steps, checkpoints)
    return r * steps - math.comb(checkpoints + r, r - 1)


def _chooser(cache_size: int = 1 << 16):
    """The moves of the binomial tree; a state is the checkpoint count, capped at
    steps - 1 (every larger count gives the same tree: j = 1 at every node), so that
    equal sub-trees have equal states."""
    split = lru_cache(maxsize=cache_size)(first_split)

    def choose(i: int, t: int, c: int):
        steps = t - i + 1
        j = split(steps, min(c, steps - 1))
        return Split(i + j, min(c - 1, t - i - j), min(c, j - 1) if j > 1 else c)

    return choose


def revolve_ops(chain: Chain, checkpoints: int) -> tuple:
    """Ops of the binomial schedule with ``checkpoints`` snapshots (a_0 included)."""
    return tree_ops(chain.length, _chooser(), checkpoints)


def loss_lower_bounds(chain: Chain) -> np.ndarray:
    """``bound[c]`` <= the peak of the schedule with c checkpoints, c = 1..L+1.

    Along the rightmost path of the tree every split keeps its checkpoint until the
    loss runs: min(c, L) checkpoints (a_L the last) besides a_0, then d_L.
    """
    L = chain.length
    x = chain.in_size
    bound = np.zeros(L + 2, dtype=np.int64)
    if L == 0:
        bound[1:] = 2 * x[0] + chain.bwd_tmp[0]
        return bound
    smallest = np.concatenate([[0], np.cumsum(np.sort(np.asarray(x[1:L], dtype=np.int64)))])
    base = x[0] + 2 * x[L] + chain.bwd_tmp[L]
    for c in range(1, L + 2):
        bound[c] = base + smallest[min(c, L) - 1]
    return bound


@register(
    "revolve",
    problem=Chain,
    exact=False,
    description="Griewank's binomial checkpointing (optimal for homogeneous chains)",
)
def revolve(
    chain: Chain, budget: int, *, checkpoints: int | None = None, progress=None
) -> Schedule:
    steps = chain.length + 1
    if checkpoints is not None and not (
        isinstance(checkpoints, int) and not isinstance(checkpoints, bool) and checkpoints >= 1
    ):
        raise ValueError(f"revolve: checkpoints = {checkpoints!r}, expected an int >= 1")
    choose, cost, memo = _chooser(), TreeCost(chain), {}
    if checkpoints is not None:
        peak = cost(choose, checkpoints)[1]
        if peak > budget:
            raise Infeasible("revolve", budget, peak, f"with checkpoints = {checkpoints}")
        return Schedule(tree_ops(chain.length, choose, checkpoints), _meta(checkpoints))
    bound = loss_lower_bounds(chain)
    fits = np.flatnonzero(bound[1:] <= budget)
    top = int(fits[-1]) + 1 if fits.size else 0  # bound is non-decreasing in c
    for c in range(top, 0, -1):
        if cost.fits(choose, c, budget):
            return Schedule(tree_ops(chain.length, choose, c), _meta(c))
        if progress is not None:
            progress((top - c + 1) / top, f"{c} checkpoints do not fit")
    least = math.inf  # the least budget: the least peak, up to the first c bounded above it
    for c in range(1, steps + 1):
        if bound[c] >= least:
            break
        least = min(least, cost(choose, c, memo)[1])
    raise Infeasible("revolve", budget, int(least))


def _meta(checkpoints: int) -> dict:
    return {"checkpoints": checkpoints, "exact": False}
