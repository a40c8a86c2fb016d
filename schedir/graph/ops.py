"""Operations of a graph schedule (docs/graphs.md).

``Compute(i)`` computes node i (its inputs must be resident; its output becomes
resident) and ``Free(i)`` frees node i's output. They print as ``Compute(3)`` and
``Free(3)`` and parse back with :func:`parse_graph_op`. Memory semantics live in
:mod:`schedir.graph_simulate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schedir.errors import InvalidSchedule


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
