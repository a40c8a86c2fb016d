"""JAX's checkpoint policies as block-chain baselines (docs/auto.md, "Baselines").

A policy applied to every block of a :class:`schedir.blocks.BlockChain` (as
``jax.checkpoint(block, policy=P)`` around each block would be) is a fixed schedule:
every stage recorded (``F_all``) with the option named after the policy, then the
backward. Its peak is its least budget. Option names: ``everything_saveable`` (plain
autodiff), ``checkpoint_dots``, ``nothing_saveable`` (only the block's inputs and
outputs are kept; the block is recomputed in its backward).
"""

from __future__ import annotations

from schedir import B, F_all, Loss
from schedir.blocks.problem import BlockChain
from schedir.blocks.schedule import BlockSchedule
from solvers.registry import Infeasible, fixed_schedule, register

POLICIES = ("everything_saveable", "checkpoint_dots", "nothing_saveable")


def recorded(options: list[int]) -> BlockSchedule:
    """Every block recorded once with its option (``options[k]`` for block k), the loss,
    then the backward: what ``jax.checkpoint`` with a policy around each block runs."""
    L = len(options)
    ops = [F_all(k) for k in range(L)] + [Loss()] + [B(k) for k in range(L - 1, -1, -1)]
    return BlockSchedule(tuple(ops), {}, tuple(options))


def policy_schedule(problem: BlockChain, policy: str) -> BlockSchedule:
    """Every block recorded with the option called ``policy``, then the backward."""
    options = []
    for k, stage in enumerate(problem.stages):
        names = [o.name for o in stage.options]
        if policy not in names:
            raise Infeasible(policy, 0, None, f"stage {k} ({stage.name}) has no option {policy!r}")
        options.append(names.index(policy))
    schedule = recorded(options)
    schedule.meta.update(exact=True, policy=policy)
    return schedule


def _register(policy: str) -> None:
    @register(
        policy,
        problem=BlockChain,
        exact=True,
        description=f"JAX's {policy} policy on every block (a fixed schedule)",
        fixed=True,
    )
    def solve(problem: BlockChain, budget: int) -> BlockSchedule:
        return fixed_schedule(policy, problem, policy_schedule(problem, policy), budget)


for _policy in POLICIES:
    _register(_policy)
