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

from schedir.chain.schedule import Schedule
from schedir.errors import InvalidSchedule
from schedir.graph.ops import GRAPH_OP_TYPES, Compute, effect, parse_graph_op
from schedir.graph.problem import Graph
from schedir.trace import Span, Trace, TraceRecorder

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
    done = [False] * n
    recorder = TraceRecorder(total, record_buffers)
    held = _Resident(resident)
    for step, op in enumerate(ops):
        try:
            eff = effect(graph, op, held)
        except InvalidSchedule as err:
            raise InvalidSchedule(f"op {step}: {op}: {err}") from None
        for j in eff.adds:
            resident[j] = True
            total += nodes[j].size
            done[j] = True
        for j in eff.frees:  # only Free frees, and what it frees is gone when it ends
            resident[j] = False
            total -= nodes[j].size
        recorder.record(
            total + eff.tmp,
            total,
            eff.time,
            lambda: (nodes[j].name for j in range(n) if resident[j]),
        )
    missing = [nodes[i].name for i in graph.computed if not done[i]]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InvalidSchedule(
            f"op {len(ops)} (after the last op): incomplete step, never computed: "
            f"{', '.join(missing[:5])}{more}"
        )
    return recorder.trace(ops)


class _Resident:
    """``j in resident`` over the simulator's list of flags (no set rebuilt per op)."""

    __slots__ = ("flags",)

    def __init__(self, flags: list[bool]):
        self.flags = flags

    def __contains__(self, j: object) -> bool:
        return isinstance(j, int) and 0 <= j < len(self.flags) and self.flags[j]


def graph_lanes(graph: Graph, schedule: Schedule, trace: Trace) -> dict[str, list[Span]]:
    """One ``compute`` lane of the Compute ops (Free ops take no time and are not drawn).

    Kind: the node's kind, ``recompute`` for the second and later computes of a node.
    """
    seen: set[int] = set()
    spans = []
    for op, s, e in zip(trace.ops, trace.start, trace.end, strict=True):
        if not isinstance(op, Compute):
            continue
        node = graph.nodes[op.node]
        kind = "recompute" if op.node in seen else node.kind
        seen.add(op.node)
        spans.append(Span(s, e, node.name, kind))
    return {"compute": spans}
