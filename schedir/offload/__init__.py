"""The offload kind: a chain on one device with a host memory and copy engines
(docs/offload.md). Problem, copy ops, the two-stream simulator."""

from schedir.offload.problem import (
    Evict,
    Offload,
    OffloadProblem,
    OffloadSchedule,
    OffloadTrace,
    Prefetch,
    Wait,
    parse_offload_op,
    simulate_offload,
)

__all__ = [
    "Evict",
    "Offload",
    "OffloadProblem",
    "OffloadSchedule",
    "OffloadTrace",
    "Prefetch",
    "Wait",
    "parse_offload_op",
    "simulate_offload",
]
