"""The data of a task graph as the runtime and the LP see it (:func:`data_layout`)."""

from __future__ import annotations

from dataclasses import dataclass

HOST = "host"  # where sources start and offloaded data go
SOURCES = ("input", "param")  # data without a producer: on the host when a run starts


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
        footprint: per task, the bytes it needs on its device at once: its
            temporaries and the data it reads and writes.
        rebuild_bytes: per datum, the bytes recomputing it adds besides itself: its
            producer's temporaries and other outputs (accumulators aside).
    """

    size: list
    kind: list
    name: list
    reads: list
    writes: list
    producer: list
    readers: list
    droppable: list
    footprint: list
    rebuild_bytes: list


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
    footprint = [task.temp + sum(size[d] for d in {*reads[t], *writes[t]})
                 for t, task in enumerate(tasks)]  # fmt: skip
    rebuild_bytes = [
        0 if p is None else tasks[p].temp + sum(
            size[w] for w in writes[p] if w != d and kind[w] != "accumulator")
        for d, p in enumerate(producer)
    ]  # fmt: skip
    return DataLayout(size, kind, name, reads, writes, producer, readers, droppable, footprint,
                      rebuild_bytes)  # fmt: skip
