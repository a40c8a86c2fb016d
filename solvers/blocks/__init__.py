"""Solvers of ``schedir.blocks.BlockChain`` (docs/auto.md); importing registers them."""

from solvers.blocks import options, policies, rotor

__all__ = ["options", "policies", "rotor"]
