"""The block-chain kind: a chain of blocks, each with several save options (what the
automatic planner of ``jax_exec.auto`` solves; docs/auto.md)."""

from schedir import kind as _kind
from schedir.blocks.problem import BlockChain, BlockOption, BlockStage
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import block_lanes, schedule_options, simulate_blocks

KIND = _kind.register(
    _kind.Kind(
        name="blocks",
        problem=BlockChain,
        schedules=(BlockSchedule,),  # chain (and copy) ops and each block's option
        formats={"schedir.block_chain": BlockChain, BlockSchedule.FORMAT: BlockSchedule},
        simulate=simulate_blocks,
        judge=None,
        lanes=block_lanes,
        budget="required",
    )
)

__all__ = [
    "KIND",
    "BlockChain",
    "BlockSchedule",
    "BlockOption",
    "BlockStage",
    "schedule_options",
    "simulate_blocks",
]
