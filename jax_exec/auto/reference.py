"""The store-all reference of a block model: what percentage budgets and overheads are
relative to (docs/auto.md, "Planning exactly")."""

from __future__ import annotations

from dataclasses import dataclass

from jax_exec.program.model import BlockModel
from jax_exec.program.options import store_all_options
from schedir import Schedule
from schedir.blocks.schedule import BlockSchedule
from solvers.blocks.policies import policy_schedule


@dataclass(frozen=True)
class StoreAll:
    """The store-all reference: ``peak_memory`` (bytes) of every block recorded keeping
    what XLA keeps for a plain step (``xla_fused``; ``everything_saveable`` in scanned
    stacks, whose iterations XLA cannot fuse across), ``makespan`` (seconds) without any
    recomputation (plain autodiff)."""

    peak_memory: int
    makespan: float


def reference_schedule(bm: BlockModel) -> Schedule:
    """Store-all with, per block, what XLA keeps for a plain step (:class:`StoreAll`)."""
    schedule = policy_schedule(bm.problem, "everything_saveable")
    options = [
        next(o for o, opt in enumerate(stage.options) if opt.name == want.label)
        for want, stage in zip(store_all_options(bm), bm.problem.stages, strict=True)
    ]
    return BlockSchedule(schedule.ops, {}, tuple(options))
