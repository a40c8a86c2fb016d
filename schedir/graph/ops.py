"""Operations of a graph schedule (docs/graphs.md).

``Compute(i)`` computes node i (its inputs must be resident; its output becomes
resident) and ``Free(i)`` frees node i's output. They print as ``Compute(3)`` and
``Free(3)`` and parse back with :func:`parse_graph_op`. What each op reads, adds and
frees is :func:`effect`, read by the graph simulator and the executors.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedir.errors import InvalidSchedule

if TYPE_CHECKING:
    from schedir.graph.problem import Graph


@dataclass(frozen=True)
class _NodeOp:
    node: int

    def __post_init__(self) -> None:
        if isinstance(self.node, bool) or not isinstance(self.node, int) or self.node < 0:
            raise InvalidSchedule(f"{type(self).__name__}: node = {self.node!r}, expected int >= 0")

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.node})"

    __repr__ = __str__


class Compute(_NodeOp):
    """Compute node i: needs every input of i resident, adds i's output."""


class Free(_NodeOp):
    """Free node i's output (it must be resident)."""


GraphOp = Compute | Free
GRAPH_OP_TYPES: dict[str, type] = {"Compute": Compute, "Free": Free}
_OP_RE = re.compile(r"^\s*(\w+)\(\s*(\d+)\s*\)\s*$")


def parse_graph_op(text: str) -> GraphOp:
    """Parse the printed form of a graph op.

    >>> parse_graph_op("Compute(3)"), parse_graph_op("Free(0)")
    (Compute(3), Free(0))
    """
    match = _OP_RE.match(text) if isinstance(text, str) else None
    if match is None or match.group(1) not in GRAPH_OP_TYPES:
        raise InvalidSchedule(
            f"cannot parse graph op {text!r}: expected 'Compute(i)' or 'Free(i)' with i >= 0"
        )
    return GRAPH_OP_TYPES[match.group(1)](int(match.group(2)))


@dataclass(frozen=True)
class Effect:
    """What one graph op does (docs/graphs.md).

    Attributes:
        reads: nodes whose outputs the op reads (resident when it starts).
        adds: nodes whose outputs it makes resident.
        frees: nodes whose outputs it frees.
        time: its duration, seconds (a node's ``cost``; 0 for ``Free``).
        tmp: temporary bytes while it runs, on top of the resident outputs.
    """

    reads: tuple[int, ...]
    adds: tuple[int, ...]
    frees: tuple[int, ...]
    time: float
    tmp: int


def effect(graph: Graph, op: GraphOp, resident: Container[int]) -> Effect:
    """The :class:`Effect` of ``op`` on ``graph`` when the outputs of the nodes in
    ``resident`` are held: the op table of docs/graphs.md, written once.

    ``Compute(i)`` reads every input of node i (all resident), adds i (not resident,
    not an ``input`` node), takes ``cost[i]`` seconds and ``tmp[i]`` temporary bytes;
    ``Free(i)`` frees i (resident) in no time. Raises ``InvalidSchedule`` naming the
    node when a precondition fails.

    >>> from schedir.graph import build_graph
    >>> g = build_graph([{"name": "x", "kind": "input", "cost": 0, "size": 4},
    ...                  {"name": "y", "cost": 1.5, "size": 8, "inputs": ["x"], "tmp": 2}])
    >>> effect(g, Compute(1), {0})
    Effect(reads=(0,), adds=(1,), frees=(), time=1.5, tmp=2)
    >>> effect(g, Free(0), {0, 1}).frees
    (0,)
    """
    nodes = graph.nodes
    i = op.node
    if i >= len(nodes):
        raise InvalidSchedule(f"node {i} out of range 0..{len(nodes) - 1}")
    node = nodes[i]
    if isinstance(op, Free):
        if i not in resident:
            raise InvalidSchedule(f"{node.name} is not resident")
        return Effect((), (), (i,), 0.0, 0)
    if not isinstance(op, Compute):
        raise InvalidSchedule(f"{op!r} is not a graph op")
    if node.kind == "input":
        raise InvalidSchedule(f"{node.name} is an input, it cannot be computed")
    for j in node.inputs:
        if j not in resident:
            raise InvalidSchedule(f"{node.name} needs {nodes[j].name} (node {j}), not resident")
    if i in resident:
        raise InvalidSchedule(f"{node.name} is already resident")
    return Effect(tuple(node.inputs), (i,), (), node.cost, node.tmp)
