"""Solvers of ``schedir.Graph`` (docs/graphs.md); importing registers them."""

from solvers.graph import baselines, checkmate_lp, checkmate_milp, dtr

__all__ = ["baselines", "checkmate_lp", "checkmate_milp", "dtr"]
