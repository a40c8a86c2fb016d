"""Task graphs: the problem of a dynamic run (docs/dynamic_training.md).

A :class:`TaskGraph` is a DAG of tasks, each with a kind (what runs: e.g. ``"F2"``,
the forward of pipeline group 2), a work in seconds at speed 1, and input edges that
carry bytes. A graph may also name its data (:class:`Datum`: what each task reads and
writes, with sizes and kinds); the runtime then tracks where every datum lives, frees
it when its last reader ran, admits a task on a device only if what it needs fits
there and evicts under pressure (:mod:`schedir.dynamic.runtime`). Without data, every
edge is a datum read by one task. The graphs of pipeline problems are built by
:mod:`schedir.dynamic.pipeline_graphs`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from schedir.dynamic.dataflow import SOURCES
from schedir.errors import InvalidProblem
from schedir.platform import check_bytes, check_number

DATA_KINDS = ("activation", "stash", "gradient", "input", "param", "accumulator", "output")


@dataclass(frozen=True)
class Datum:
    """One piece of data of a task graph.

    Attributes:
        name: display name, e.g. ``"s2[5]"`` (the stash of group 2, micro-batch 5).
        size: bytes it takes on a device.
        kind: ``"activation"`` (a_k), ``"stash"`` (what a backward needs from its
            forward besides the forward's own inputs), ``"gradient"`` (d_k),
            ``"input"`` (a model input or target) and ``"param"`` (a group's
            parameters), both on the host at the start and copied to every device
            that runs a task reading them; ``"accumulator"`` (a group's parameter
            gradients: each device that runs a task writing it holds its own partial
            sum, updated in place; a task reading it gathers every partial);
            ``"output"`` (read by no task, kept to the end).
        recompute: may be dropped under memory pressure and rebuilt by running its
            producer again (its readers read all of the producer's inputs too).
    """

    name: str
    size: int
    kind: str = "activation"
    recompute: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidProblem(f"datum name = {self.name!r}: expected a string")
        object.__setattr__(self, "size", check_bytes(f"datum {self.name!r} size", self.size))
        if self.kind not in DATA_KINDS:
            raise InvalidProblem(f"datum {self.name!r} kind = {self.kind!r}: expected one of "
                                 f"{', '.join(DATA_KINDS)}")  # fmt: skip
        if not isinstance(self.recompute, bool):
            raise InvalidProblem(f"datum {self.name!r} recompute = {self.recompute!r}: "
                                 "expected a bool")  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        name: display name, e.g. ``"F2[5]"``.
        kind: what it runs (the performance model's key), e.g. ``"F2"``.
        work: seconds at speed 1.
        deps: (producer task index, bytes of the edge) pairs.
        item: the stream item it belongs to (None: not part of a stream).
        final: whether its end completes its item.
        reads, writes: indices of the data (``TaskGraph.data``) it reads and writes.
        temp: bytes it needs on its device only while it runs.
    """

    name: str
    kind: str
    work: float
    deps: tuple[tuple[int, int], ...] = ()
    item: int | None = None
    final: bool = False
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    temp: int = 0

    def __post_init__(self) -> None:
        for field_name in ("name", "kind"):
            if not isinstance(getattr(self, field_name), str):
                raise InvalidProblem(f"task {field_name} = {getattr(self, field_name)!r}: "
                                     "expected a string")  # fmt: skip
        label = f"task {self.name!r}"
        object.__setattr__(self, "work", check_number(f"{label} work", self.work, what="time (s)"))
        try:
            deps = tuple((p, n) for p, n in self.deps)
        except (TypeError, ValueError):
            raise InvalidProblem(
                f"{label} deps = {self.deps!r}: expected (task, bytes) pairs"
            ) from None
        for p, n in deps:
            if isinstance(p, bool) or not isinstance(p, numbers.Integral):
                raise InvalidProblem(f"{label}: dep on {p!r}: expected a task index")
            check_bytes(f"{label}: bytes of its dep on {p}", n)
        object.__setattr__(self, "deps", tuple((int(p), int(n)) for p, n in deps))
        item = self.item
        if item is not None and (isinstance(item, bool) or not isinstance(item, numbers.Integral)):
            raise InvalidProblem(f"{label} item = {item!r}: expected an integer or None")
        if not isinstance(self.final, bool):
            raise InvalidProblem(f"{label} final = {self.final!r}: expected a bool")
        for name in ("reads", "writes"):
            ids = getattr(self, name)
            if isinstance(ids, str) or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in ids
            ):
                raise InvalidProblem(f"{label} {name} = {ids!r}: expected datum indices")
            object.__setattr__(self, name, tuple(int(d) for d in ids))
        object.__setattr__(self, "temp", check_bytes(f"{label} temp", self.temp))


@dataclass(frozen=True)
class TaskGraph:
    """Tasks in a topological order (every dep points to an earlier task), optionally
    with their data.

    ``data``: when given, every datum but a source (``"input"``, ``"param"``) has its
    writers (one task, or for an accumulator the tasks adding to it), each before its
    readers and among their deps. ``groups``: the stage range [first, last) of each
    group (kinds ``F{g}``, ``B{g}``, ``W{g}``), when the graph is a pipeline's.
    """

    tasks: tuple[Task, ...]
    data: tuple[Datum, ...] = ()
    groups: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "data", tuple(self.data))
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        for t, task in enumerate(self.tasks):
            if not isinstance(task, Task):
                raise InvalidProblem(f"tasks[{t}] = {task!r}: expected a Task")
            for p, _ in task.deps:
                if not 0 <= p < t:
                    raise InvalidProblem(
                        f"task {task.name!r} (index {t}) depends on task {p}: deps must "
                        "point to earlier tasks (a topological order)"
                    )
            if not self.data and (task.reads or task.writes):
                raise InvalidProblem(f"task {task.name!r} reads or writes data, but the "
                                     "graph lists none")  # fmt: skip
        if self.data:
            self._check_data()

    def _check_data(self) -> None:
        for k, d in enumerate(self.data):
            if not isinstance(d, Datum):
                raise InvalidProblem(f"data[{k}] = {d!r}: expected a Datum")
        writers, readers = self.writers(), self.readers()
        for k, d in enumerate(self.data):
            if d.kind in SOURCES and writers[k]:
                raise InvalidProblem(f"datum {d.name!r} is a {d.kind}: no task writes it")
            if d.kind not in SOURCES and not writers[k]:
                raise InvalidProblem(f"datum {d.name!r}: no task writes it")
            if d.kind != "accumulator" and len(writers[k]) > 1:
                raise InvalidProblem(f"datum {d.name!r} is written by several tasks (only an "
                                     "accumulator may be)")  # fmt: skip
            for r in readers[k]:
                deps = {p for p, _ in self.tasks[r].deps}
                missing = [w for w in writers[k] if w not in deps]
                if missing:
                    raise InvalidProblem(f"task {self.tasks[r].name!r} reads {d.name!r} but does "
                                         f"not depend on its writer "
                                         f"{self.tasks[missing[0]].name!r}")  # fmt: skip
            if d.recompute:
                if d.kind in SOURCES or d.kind == "accumulator":
                    raise InvalidProblem(f"datum {d.name!r}: a {d.kind} cannot be recomputed")
                inputs = set(self.tasks[writers[k][0]].reads)
                for r in readers[k]:
                    lost = inputs - set(self.tasks[r].reads)
                    if lost:
                        raise InvalidProblem(
                            f"datum {d.name!r} may be recomputed, so its reader "
                            f"{self.tasks[r].name!r} must read its producer's inputs too "
                            f"(it does not read {self.data[min(lost)].name!r})"
                        )

    def writers(self) -> list[list[int]]:
        """Tasks writing each datum."""
        out: list[list[int]] = [[] for _ in self.data]
        for t, task in enumerate(self.tasks):
            for d in task.writes:
                self._datum(d, task)
                out[d].append(t)
        return out

    def readers(self) -> list[list[int]]:
        """Tasks reading each datum (each once)."""
        out: list[list[int]] = [[] for _ in self.data]
        for t, task in enumerate(self.tasks):
            for d in dict.fromkeys(task.reads):
                self._datum(d, task)
                out[d].append(t)
        return out

    def _datum(self, d: int, task: Task) -> None:
        if not 0 <= d < len(self.data):
            raise InvalidProblem(f"task {task.name!r} uses datum {d}: out of range "
                                 f"0..{len(self.data) - 1}")  # fmt: skip

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.tasks]
        for t, task in enumerate(self.tasks):
            for p in dict.fromkeys(p for p, _ in task.deps):
                succ[p].append(t)
        return succ
