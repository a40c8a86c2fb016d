"""The chain kind: a sequence of stages trained by forward and backward passes
(docs/semantics.md). Problem (:class:`Chain`), ops and their effects, the simulator,
discretization."""

from schedir import kind as _kind
from schedir.chain.discretize import Discretized, discretize
from schedir.chain.ops import B, Effect, F_all, F_ck, F_n, Loss, effect, parse_op
from schedir.chain.problem import Chain
from schedir.chain.schedule import Schedule
from schedir.chain.simulate import chain_lanes, simulate_chain

KIND = _kind.register(
    _kind.Kind(
        name="chain",
        problem=Chain,
        schedules=(Schedule,),
        formats={"schedir.chain": Chain, Schedule.FORMAT: Schedule},
        simulate=simulate_chain,
        judge=None,
        lanes=chain_lanes,
        budget="required",
    )
)

__all__ = [
    "KIND",
    "B",
    "Chain",
    "Discretized",
    "Effect",
    "F_all",
    "F_ck",
    "F_n",
    "Loss",
    "discretize",
    "effect",
    "parse_op",
    "simulate_chain",
]
