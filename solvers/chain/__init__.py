"""Solvers of ``schedir.Chain`` (docs/chain_solvers.md); importing registers them."""

from solvers.chain import chen_sqrt, recompute_all, revolve, rotor, store_all

__all__ = ["chen_sqrt", "recompute_all", "revolve", "rotor", "store_all"]
