"""The chain kind: a sequence of stages trained by forward and backward passes
(docs/semantics.md). Problem (:class:`Chain`), ops, discretization."""

from schedir.chain.discretize import Discretized, discretize
from schedir.chain.ops import B, F_all, F_ck, F_n, Loss, parse_op
from schedir.chain.problem import Chain

__all__ = ["B", "Chain", "Discretized", "F_all", "F_ck", "F_n", "Loss", "discretize", "parse_op"]
