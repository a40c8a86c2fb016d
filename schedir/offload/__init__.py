"""The offload kind: a chain on one device with a host memory and copy engines
(docs/offload.md). Problem, copy ops, the two-stream simulator; drawn on three lanes
(compute, d2h, h2d)."""

from schedir import kind as _kind
from schedir.chain.schedule import Schedule
from schedir.offload.ops import (
    Evict,
    Offload,
    OffloadSchedule,
    Prefetch,
    Wait,
    is_compute,
    parse_buffer,
    parse_offload_op,
)
from schedir.offload.problem import OffloadProblem
from schedir.offload.simulate import (
    OffloadTrace,
    offload_lanes,
    offload_memory,
    simulate_offload,
)
from schedir.platform import Platform

KIND = _kind.register(
    _kind.Kind(
        name="offload",
        problem=OffloadProblem,
        schedules=(OffloadSchedule, Schedule),  # a plain chain schedule: no copies
        formats={
            "schedir.offload_problem": OffloadProblem,
            OffloadSchedule.FORMAT: OffloadSchedule,
            "schedir.platform": Platform,
        },
        simulate=simulate_offload,
        judge=None,
        lanes=offload_lanes,
        budget="required",
        memory=offload_memory,
    )
)

__all__ = [
    "KIND",
    "Evict",
    "Offload",
    "OffloadProblem",
    "OffloadSchedule",
    "OffloadTrace",
    "Prefetch",
    "Wait",
    "is_compute",
    "parse_buffer",
    "parse_offload_op",
    "simulate_offload",
]
