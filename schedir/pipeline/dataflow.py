"""The data of a task graph as the runtime and the LP see it, and what a dynamic run
did (:class:`DynamicTrace`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HOST = "host"  # where sources start and offloaded data go
SOURCES = ("input", "param")  # data without a producer: on the host when a run starts


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


@dataclass(frozen=True)
class DataLayout:
    """The data of a graph, per datum and per task (a graph without data: one datum
    per edge, an ``"activation"`` read by its one reader).

    Attributes:
        size, kind, name: of each datum.
        reads, writes: per task, the data it reads / writes (each once).
        producer: per datum, the task writing it (None: a source or an accumulator).
        readers: per datum, the tasks reading it.
        droppable: per datum, whether it may be dropped and recomputed.
    """

    size: list
    kind: list
    name: list
    reads: list
    writes: list
    producer: list
    readers: list
    droppable: list


def data_layout(graph) -> DataLayout:
    """The :class:`DataLayout` of ``graph``."""
    tasks = graph.tasks
    if graph.data:
        size = [d.size for d in graph.data]
        kind = [d.kind for d in graph.data]
        name = [d.name for d in graph.data]
        recompute = [d.recompute for d in graph.data]
        reads = [tuple(dict.fromkeys(t.reads)) for t in tasks]
        writes = [tuple(dict.fromkeys(t.writes)) for t in tasks]
    else:
        size, kind, name, recompute = [], [], [], []
        reads, writes = [[] for _ in tasks], [[] for _ in tasks]
        for t, task in enumerate(tasks):
            for p, nbytes in task.deps:
                reads[t].append(len(size))
                writes[p].append(len(size))
                size.append(nbytes)
                kind.append("activation")
                name.append(f"{tasks[p].name}->{task.name}")
                recompute.append(False)
    producer: list = [None] * len(size)
    readers: list = [[] for _ in size]
    for t in range(len(tasks)):
        for d in writes[t]:
            if kind[d] != "accumulator":
                producer[d] = t
        for d in reads[t]:
            readers[d].append(t)
    droppable = [r and producer[d] is not None for d, r in enumerate(recompute)]
    return DataLayout(size, kind, name, reads, writes, producer, readers, droppable)
