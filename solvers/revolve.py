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

On heterogeneous chains the split points come from the mean (unit) costs, as revolve
would choose them; the simulator then evaluates the true time and memory. Given a
budget, the largest c whose schedule fits is used (``meta["checkpoints"]``).
"""

from __future__ import annotations

import math

import numpy as np

from schedir import Chain, Schedule, simulate_chain
from solvers._chain_tree import Split, tree_ops
from solvers.registry import Infeasible, register


def advances_table(steps: int, checkpoints: int) -> tuple[np.ndarray, np.ndarray]:
    """A[l, c] (least forward advances) and the optimal first split j, for l, c >= 1."""
    A = np.full((steps + 1, checkpoints + 1), np.inf)
    split = np.zeros((steps + 1, checkpoints + 1), dtype=np.int64)
    A[1, :] = 0
    for c in range(1, checkpoints + 1):
        for l in range(2, steps + 1):
            j = np.arange(1, l)
            cost = j + A[l - j, c - 1] + A[j, c]
            k = int(np.argmin(cost))
            A[l, c], split[l, c] = cost[k], k + 1
    return A, split


def revolve_ops(chain: Chain, checkpoints: int, split: np.ndarray | None = None) -> tuple:
    """Ops of the binomial schedule with ``checkpoints`` snapshots (a_0 included).

    ``split`` is a table from :func:`advances_table` covering ``checkpoints`` (reused
    across calls); it is computed when not given.
    """
    if split is None:
        _, split = advances_table(chain.length + 1, checkpoints)

    def choose(i: int, t: int, c: int):
        j = int(split[t - i + 1, c])
        return Split(i + j, c - 1, c)

    return tree_ops(chain.length, choose, checkpoints)


def griewank_advances(steps: int, checkpoints: int) -> int:
    """Griewank's closed form for the least number of forward advances."""
    if steps <= 1:
        return 0
    r = 0
    while math.comb(checkpoints + r, checkpoints) < steps:
        r += 1
    return r * steps - math.comb(checkpoints + r, r - 1)


@register(
    "revolve",
    problem=Chain,
    exact=False,
    description="Griewank's binomial checkpointing (optimal for homogeneous chains)",
)
def revolve(chain: Chain, budget: int, *, checkpoints: int | None = None) -> Schedule:
    steps = chain.length + 1
    if checkpoints is not None and not (isinstance(checkpoints, int) and checkpoints >= 1):
        raise ValueError(f"revolve: checkpoints = {checkpoints!r}, expected an int >= 1")
    candidates = [checkpoints] if checkpoints is not None else range(steps, 0, -1)
    _, split = advances_table(steps, max(candidates))
    least = math.inf
    for c in candidates:
        ops = revolve_ops(chain, c, split)
        peak = simulate_chain(chain, ops).peak_memory
        least = min(least, peak)
        if peak <= budget:
            return Schedule(ops, {"checkpoints": c})
    raise Infeasible("revolve", budget, int(least))
