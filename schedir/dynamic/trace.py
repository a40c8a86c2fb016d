"""What a dynamic run did (:class:`DynamicTrace`), as the simulator and the JAX
runtime report it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DynamicTrace:
    """What a dynamic run did.

    Attributes:
        makespan: end of the last task, seconds.
        period: steady-state seconds per item (sorted completions, second half).
        completion: completion time of each item, seconds (item order).
        device: device that ran each task.
        start, end: of each task, seconds (start: when it began computing).
        predicted_end: the policy's predicted end of each task when it was placed
            (None for policies without a model).
        transfers: (src, dst, bytes, start, end) of every transfer (src or dst
            ``"host"`` for offloads and copies from the host).
        duration: compute seconds of each task (without recomputations).
        recompute: seconds each task spent recomputing dropped data first.
        rebuilt: the data each task recomputed (datum indices).
        memory: per device, (times, bytes) of the bytes the runtime held there.
        device_peak: the largest of those bytes per device.
        evictions: (time, datum name, device, mode) with mode ``"free"`` (another copy
            is kept), ``"offload"`` (moved to the host) or ``"drop"`` (recomputed later).
        graph, platform: what ran, and where.
    """

    makespan: float
    period: float
    completion: list
    device: list
    start: list
    end: list
    predicted_end: list
    transfers: list = field(default_factory=list)
    duration: list = field(default_factory=list)
    recompute: list = field(default_factory=list)
    rebuilt: list = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    device_peak: dict = field(default_factory=dict)
    evictions: list = field(default_factory=list)
    graph: object = None
    platform: object = None

    @property
    def throughput(self) -> float:
        """Items per second: items / makespan."""
        return len(self.completion) / self.makespan if self.makespan > 0 else math.inf
