"""Solvers of ``schedir.blocks.BlockChain`` (docs/auto.md); importing registers them."""

from solvers.blocks import options, policies, rotor, whole_milp

__all__ = ["options", "policies", "rotor", "whole_milp"]
