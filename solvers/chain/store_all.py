"""``store_all``: record every stage, no recomputation (the fastest, most memory)."""

from __future__ import annotations

from schedir import B, Chain, F_all, Loss, Schedule
from solvers.registry import fixed_schedule, register


def store_all_ops(chain: Chain) -> tuple:
    L = chain.length
    return (*(F_all(k) for k in range(L)), Loss(), *(B(k) for k in range(L - 1, -1, -1)))


@register(
    "store_all",
    problem=Chain,
    exact=False,
    description="record every stage's residuals, no recomputation (fastest, most memory)",
    fixed=True,
)
def store_all(chain: Chain, budget: int) -> Schedule:
    return fixed_schedule(
        "store_all", chain, Schedule(store_all_ops(chain), {"exact": False}), budget
    )
