"""The block-chain kind: a chain of blocks, each with several save options (what the
automatic planner of ``jax_exec.auto`` solves; docs/auto.md)."""

from schedir.blocks.problem import (
    BlockChain,
    BlockOption,
    BlockStage,
    schedule_options,
    simulate_blocks,
)

__all__ = ["BlockChain", "BlockOption", "BlockStage", "schedule_options", "simulate_blocks"]
