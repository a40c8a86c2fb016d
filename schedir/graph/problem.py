"""The graph problem: a DAG of nodes with costs and output sizes (docs/graphs.md).

Nodes are listed in a fixed topological order; each produces one output buffer.
``kind`` is ``"input"`` (resident at the start, never computed, cannot be recomputed
once freed), ``"forward"`` or ``"backward"`` (the backward nodes are part of the
graph, as in Checkmate: Jain et al., "Checkmate: Breaking the memory wall with optimal
tensor rematerialization", MLSys 2020). Exact semantics: ``docs/graphs.md``.

Conversions from chains live in :mod:`schedir.graph.convert`, generators of test and
demo graphs in :mod:`schedir.graph.generators`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from schedir.chain.problem import seconds
from schedir.errors import InvalidProblem

NODE_KINDS = ("input", "forward", "backward")
FORMAT = "schedir.graph"


@dataclass(frozen=True)
class Node:
    """One node of a :class:`Graph`.

    Attributes:
        name: unique name.
        cost: compute time, seconds (finite, >= 0).
        size: bytes of the node's output (integer >= 0).
        inputs: indices of the nodes whose outputs it reads (all earlier in the order).
        kind: ``"input"``, ``"forward"`` or ``"backward"``.
        tmp: extra bytes live only while the node computes (integer >= 0).
    """

    name: str
    cost: float
    size: int
    inputs: tuple[int, ...] = ()
    kind: str = "forward"
    tmp: int = 0


def _size(where: str, value: object) -> int:
    """An exact non-negative int (any Python int; a float only if whole and finite)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        size = int(value)
    elif (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and float(value).is_integer()
    ):
        size = int(value)
    else:
        raise InvalidProblem(f"{where} = {value!r}: sizes must be integers (bytes)")
    if size < 0:
        raise InvalidProblem(f"{where} = {value!r}: sizes must be non-negative")
    return size


def _cost(where: str, value: object) -> float:
    return seconds(where, value)


def _check_cost_sum(nodes: Sequence[Node]) -> None:
    """Refuse costs whose sums overflow: a schedule may compute each node up to once per
    node (Checkmate's stages), so ``len(nodes) * fsum(costs)`` must be a finite float."""
    try:
        total = math.fsum(n.cost for n in nodes)
    except OverflowError:
        total = math.inf
    if not math.isfinite(total * len(nodes)):
        worst = max(range(len(nodes)), key=lambda i: nodes[i].cost)
        raise InvalidProblem(
            f"nodes[*].cost: the costs sum to {total!r} seconds (largest: nodes[{worst}] "
            f"({nodes[worst].name}).cost = {nodes[worst].cost!r}); with {len(nodes)} nodes "
            f"makespans would overflow a float: use a larger time unit"
        )


def _find_cycle(edges: list[list[int]]) -> list[int] | None:
    """A cycle of the directed graph ``i -> edges[i]`` (as a node list), or None."""
    color = [0] * len(edges)
    for root in range(len(edges)):
        if color[root]:
            continue
        stack, path = [(root, iter(edges[root]))], [root]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt) :] + [nxt]
            elif color[nxt] == 0:
                color[nxt] = 1
                stack.append((nxt, iter(edges[nxt])))
                path.append(nxt)
    return None


@dataclass(frozen=True)
class Graph:
    """A computation graph (forward and backward nodes) in topological order.

    Attributes:
        nodes: the nodes; node i may only read nodes j < i.
        users: ``users[i]`` are the nodes that read node i, ascending (derived).
    """

    nodes: tuple[Node, ...]
    users: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, (str, bytes)) or not isinstance(self.nodes, Sequence):
            raise InvalidProblem(f"nodes = {self.nodes!r}: expected a sequence of Node")
        if not self.nodes:
            raise InvalidProblem("a graph needs at least one node")
        nodes = []
        names: dict[str, int] = {}
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            if isinstance(node, Mapping):
                node = Node(**node)
            if not isinstance(node, Node):
                raise InvalidProblem(f"nodes[{i}] = {node!r}: expected a Node")
            if not isinstance(node.name, str) or not node.name:
                raise InvalidProblem(f"nodes[{i}].name = {node.name!r}: expected a non-empty str")
            if node.name in names:
                raise InvalidProblem(
                    f"nodes[{i}]: name {node.name!r} also names node {names[node.name]}"
                )
            names[node.name] = i
            if node.kind not in NODE_KINDS:
                raise InvalidProblem(
                    f"nodes[{i}] ({node.name}).kind = {node.kind!r}: expected one of {NODE_KINDS}"
                )
            where = f"nodes[{i}] ({node.name})"
            inputs = []
            for j in node.inputs:
                if isinstance(j, bool) or not isinstance(j, numbers.Integral):
                    raise InvalidProblem(f"{where}.inputs: {j!r} is not a node index")
                if not 0 <= j < n:
                    raise InvalidProblem(f"{where}.inputs: dangling edge to node {j} (0..{n - 1})")
                inputs.append(int(j))
            if len(set(inputs)) != len(inputs):
                raise InvalidProblem(f"{where}.inputs = {inputs}: an input is listed twice")
            if node.kind == "input" and inputs:
                raise InvalidProblem(f"{where}: an input node cannot have inputs")
            nodes.append(
                Node(
                    name=node.name,
                    cost=_cost(f"{where}.cost", node.cost),
                    size=_size(f"{where}.size", node.size),
                    inputs=tuple(inputs),
                    kind=node.kind,
                    tmp=_size(f"{where}.tmp", node.tmp),
                )
            )
        _check_cost_sum(nodes)
        cycle = _find_cycle([list(node.inputs) for node in nodes])
        if cycle is not None:
            path = " <- ".join(nodes[i].name for i in cycle)
            raise InvalidProblem(f"the graph has a cycle: {path}")
        for i, node in enumerate(nodes):
            late = [j for j in node.inputs if j >= i]
            if late:
                raise InvalidProblem(
                    f"nodes[{i}] ({node.name}) reads node {late[0]} ({nodes[late[0]].name}) "
                    f"listed at or after it: nodes must be in topological order"
                )
        users: list[list[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for j in node.inputs:
                users[j].append(i)
        object.__setattr__(self, "nodes", tuple(nodes))
        object.__setattr__(self, "users", tuple(tuple(u) for u in users))

    def __len__(self) -> int:
        return len(self.nodes)

    def index(self, name: str) -> int:
        """The index of the node called ``name``."""
        for i, node in enumerate(self.nodes):
            if node.name == name:
                return i
        raise KeyError(f"no node named {name!r}")

    @property
    def inputs(self) -> tuple[int, ...]:
        """Indices of the input nodes (resident at the start)."""
        return tuple(i for i, n in enumerate(self.nodes) if n.kind == "input")

    @property
    def computed(self) -> tuple[int, ...]:
        """Indices of the nodes a schedule must compute (every non-input node)."""
        return tuple(i for i, n in enumerate(self.nodes) if n.kind != "input")

    def store_all_time(self) -> float:
        """Makespan without recomputation: every non-input node once, seconds."""
        return math.fsum(self.nodes[i].cost for i in self.computed)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": 1,
            "nodes": [
                {
                    "name": n.name,
                    "kind": n.kind,
                    "cost": n.cost,
                    "size": n.size,
                    "tmp": n.tmp,
                    "inputs": [self.nodes[j].name for j in n.inputs],
                }
                for n in self.nodes
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Graph:
        """Rebuild from :meth:`to_dict`'s form (inputs are given by node name)."""
        if d.get("format") != FORMAT:
            raise InvalidProblem(f"format = {d.get('format')!r}: expected {FORMAT!r}")
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        raw = d.get("nodes")
        if not isinstance(raw, list):
            raise InvalidProblem("graph JSON lacks the list 'nodes'")
        index = {}
        for i, nd in enumerate(raw):
            if not isinstance(nd, dict) or "name" not in nd:
                raise InvalidProblem(f"nodes[{i}] = {nd!r}: expected an object with a 'name'")
            index.setdefault(nd["name"], i)
        nodes = []
        for i, nd in enumerate(raw):
            missing = [k for k in ("cost", "size") if k not in nd]
            if missing:
                raise InvalidProblem(f"nodes[{i}] ({nd['name']}) lacks {', '.join(missing)}")
            inputs = []
            for name in nd.get("inputs", []):
                if name not in index:
                    raise InvalidProblem(f"nodes[{i}] ({nd['name']}): dangling edge to {name!r}")
                inputs.append(index[name])
            nodes.append(
                Node(
                    name=nd["name"],
                    cost=nd["cost"],
                    size=nd["size"],
                    inputs=tuple(inputs),
                    kind=nd.get("kind", "forward"),
                    tmp=nd.get("tmp", 0),
                )
            )
        return cls(tuple(nodes))


def build_graph(spec: Iterable[Mapping]) -> Graph:
    """A graph from dicts whose ``inputs`` are node *names* (handy in tests and examples).

    >>> g = build_graph([{"name": "x", "kind": "input", "cost": 0, "size": 4},
    ...                  {"name": "y", "cost": 1.0, "size": 8, "inputs": ["x"]}])
    >>> g.nodes[1].inputs
    (0,)
    """
    return Graph.from_dict({"format": FORMAT, "version": 1, "nodes": [dict(s) for s in spec]})


# ----------------------------------------------------------------- chains as graphs
