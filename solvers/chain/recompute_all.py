"""``recompute_all``: keep only the input; recompute every forward from it (quadratic time).

For each stage t from the loss down to 0: ``F_ck(0) F_n(1) ... F_n(t-1)`` rebuilds a_t
from a_0, then ``F_all(t) B(t)`` (or ``Loss()``). The classic least-memory strategy
of a homogeneous chain: it stores no checkpoint besides a_0 (revolve with one snapshot).
"""

from __future__ import annotations

from schedir import Chain, Schedule
from solvers.chain._tree import Split, tree_ops
from solvers.registry import fixed_schedule, register


def recompute_all_ops(chain: Chain) -> tuple:
    return tree_ops(chain.length, lambda i, t, _: Split(t))


@register(
    "recompute_all",
    problem=Chain,
    exact=False,
    description="keep only the input and recompute each forward from it (quadratic time)",
    fixed=True,
)
def recompute_all(chain: Chain, budget: int) -> Schedule:
    return fixed_schedule(
        "recompute_all", chain, Schedule(recompute_all_ops(chain), {"exact": False}), budget
    )
