"""The graph simulator and graph schedules (rules in docs/graphs.md).

Memory holds node outputs. Execution starts with every ``input`` node resident.
``Compute(i)`` needs every input of i resident and i not resident; it adds
``size[i]`` bytes. ``Free(i)`` needs i resident and removes it. The memory an op needs
is the resident bytes right after it (for a compute: including the new output) plus,
for a compute, ``tmp[i]``; the peak is the maximum over ops and the initial state.
Makespan is the sum of the computed nodes' costs. A schedule is a complete step when
every non-input node has been computed at least once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from schedir.errors import InvalidSchedule
from schedir.graph.ops import GRAPH_OP_TYPES, Compute, Free, parse_graph_op
from schedir.graph.problem import Graph
from schedir.io import FORMATS
from schedir.schedule import Schedule
from schedir.simulate import SIMULATORS, Trace

FORMAT = "schedir.graph_schedule"


@dataclass(frozen=True)
class GraphSchedule(Schedule):
    """A graph op sequence (``Compute``/``Free``) and a JSON-compatible ``meta`` dict.

    JSON format (version 1)::

        {"format": "schedir.graph_schedule", "version": 1,
         "ops": ["Compute(1)", "Compute(2)", "Free(1)", ...], "meta": {...}}
    """

    FORMAT: ClassVar[str] = FORMAT
    OPS: ClassVar[str] = "a graph op (Compute/Free)"

    @staticmethod
    def parse_op(text: str):
        return parse_graph_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return type(op) in GRAPH_OP_TYPES.values()


def _graph_ops(schedule_or_ops: Schedule | Iterable) -> tuple:
    if isinstance(schedule_or_ops, GraphSchedule):
        return schedule_or_ops.ops
    if isinstance(schedule_or_ops, Schedule):
        raise InvalidSchedule("a chain Schedule cannot run on a Graph (use GraphSchedule)")
    return GraphSchedule(tuple(schedule_or_ops)).ops


def simulate_graph(
    graph: Graph, schedule_or_ops: Schedule | Iterable, *, record_buffers: bool = False
) -> Trace:
    """Run graph ops on ``graph`` and return the :class:`~schedir.simulate.Trace`.

    Raises :class:`InvalidSchedule` naming the op index, the op and the missing (or
    duplicate) node, and when some non-input node is never computed.

    >>> from schedir.graph import build_graph
    >>> g = build_graph([{"name": "x", "kind": "input", "cost": 0, "size": 4},
    ...                  {"name": "y", "cost": 1.5, "size": 8, "inputs": ["x"], "tmp": 2}])
    >>> t = simulate_graph(g, ["Compute(1)", "Free(0)"])
    >>> t.makespan, t.peak_memory, t.resident
    (1.5, 14, (12, 8))
    """
    ops = _graph_ops(schedule_or_ops)
    nodes = graph.nodes
    n = len(nodes)
    resident = [False] * n
    total = 0
    for i in graph.inputs:
        resident[i] = True
        total += nodes[i].size
    initial = total
    peak = total
    done = [False] * n
    clock = 0.0
    res_after, op_peaks, starts, ends, bufs = [], [], [], [], []
    for step, op in enumerate(ops):
        i = op.node
        if i >= n:
            raise InvalidSchedule(f"op {step}: {op}: node {i} out of range 0..{n - 1}")
        name = nodes[i].name
        start = clock
        if isinstance(op, Compute):
            if nodes[i].kind == "input":
                raise InvalidSchedule(f"op {step}: {op}: {name} is an input, it cannot be computed")
            for j in nodes[i].inputs:
                if not resident[j]:
                    raise InvalidSchedule(
                        f"op {step}: {op}: {name} needs {nodes[j].name} (node {j}), not resident"
                    )
            if resident[i]:
                raise InvalidSchedule(f"op {step}: {op}: {name} is already resident")
            resident[i] = True
            total += nodes[i].size
            need = total + nodes[i].tmp
            done[i] = True
            clock += nodes[i].cost
        elif isinstance(op, Free):
            if not resident[i]:
                raise InvalidSchedule(f"op {step}: {op}: {name} is not resident")
            resident[i] = False
            total -= nodes[i].size
            need = total
        else:  # pragma: no cover - GraphSchedule() rejects foreign ops
            raise InvalidSchedule(f"op {step}: {op!r} is not a graph op")
        peak = max(peak, need)
        op_peaks.append(need)
        res_after.append(total)
        starts.append(start)
        ends.append(clock)
        if record_buffers:
            bufs.append(frozenset(nodes[j].name for j in range(n) if resident[j]))
    missing = [nodes[i].name for i in graph.computed if not done[i]]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InvalidSchedule(
            f"op {len(ops)} (after the last op): incomplete step, never computed: "
            f"{', '.join(missing[:5])}{more}"
        )
    return Trace(
        makespan=clock,
        peak_memory=peak,
        initial_memory=initial,
        resident=tuple(res_after),
        op_peak=tuple(op_peaks),
        start=tuple(starts),
        end=tuple(ends),
        ops=ops,
        buffers=tuple(bufs) if record_buffers else None,
    )


SIMULATORS[Graph] = simulate_graph
FORMATS[FORMAT] = GraphSchedule
FORMATS["schedir.graph"] = Graph
