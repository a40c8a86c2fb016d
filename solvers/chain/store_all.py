"""``store_all``: record every stage, no recomputation (the fastest, most memory)."""

from __future__ import annotations

from schedir import Chain, Schedule
from schedir.chain.ops import store_all_ops as chain_store_all_ops
from solvers.registry import fixed_schedule, register


def store_all_ops(chain: Chain) -> tuple:
    """:func:`schedir.chain.ops.store_all_ops` of the chain's length."""
    return chain_store_all_ops(chain.length)


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
