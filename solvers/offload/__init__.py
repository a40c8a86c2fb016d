"""Solvers of ``schedir.OffloadProblem`` (docs/offload.md); importing registers them."""

from solvers.offload import offload_greedy, offload_milp, rotor_offload, weight_offload

__all__ = ["offload_greedy", "offload_milp", "rotor_offload", "weight_offload"]
