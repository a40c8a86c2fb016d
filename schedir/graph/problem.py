"""The graph problem: a DAG of nodes with costs and output sizes (docs/graphs.md).

Nodes are listed in a fixed topological order; each produces one output buffer.
``kind`` is ``"input"`` (resident at the start, never computed, cannot be recomputed
once freed), ``"forward"`` or ``"backward"`` (the backward nodes are part of the
graph, as in Checkmate: Jain et al., "Checkmate: Breaking the memory wall with optimal
tensor rematerialization", MLSys 2020). Exact semantics: ``docs/graphs.md``.

:func:`chain_to_graph` converts a :class:`~schedir.chain.Chain` to a Graph whose nodes
cost what running them costs (one-output nodes: the recording forward is two nodes, see
its docstring), and :func:`chain_ops_to_graph` translates any chain schedule into a
graph schedule that the graph simulator accepts with no larger peak.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from schedir.chain.problem import Chain
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.graph.ops import Compute, Free, parse_graph_op

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
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidProblem(f"{where} = {value!r}: costs must be real numbers (seconds)")
    try:
        cost = float(value)
    except OverflowError:
        raise InvalidProblem(f"{where} = {value!r}: too large for a float (seconds)") from None
    if not math.isfinite(cost) or cost < 0:
        raise InvalidProblem(f"{where} = {value!r}: costs must be finite and non-negative")
    return cost


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


@dataclass(frozen=True)
class ChainNodes:
    """Where each chain buffer lives in ``chain_to_graph(chain)``.

    Attributes:
        a: ``a[k]`` is the node producing a_k (k = 0: the input node).
        fwd: ``fwd[k]`` computes a_{k+1} from a_k (stage k's forward), k < L.
        res: ``res[k]`` holds stage k's residuals, or None when s_k <= x_{k+1}.
        d: ``d[k]`` produces the gradient d_k (``d[L]`` is the loss node).
    """

    a: tuple[int, ...]
    fwd: tuple[int, ...]
    res: tuple[int | None, ...]
    d: tuple[int, ...]


def chain_nodes(chain: Chain) -> ChainNodes:
    """Node indices of :func:`chain_to_graph` (see its docstring for the layout)."""
    L = chain.length
    fwd, res, i = [], [], 1
    for k in range(L):
        if chain.saved_size[k] > chain.in_size[k + 1]:
            res.append(i)
            i += 1
        else:
            res.append(None)
        fwd.append(i)
        i += 1
    loss = i
    d = [loss + (L - k) for k in range(L)] + [loss]
    return ChainNodes(a=(0, *fwd), fwd=tuple(fwd), res=tuple(res), d=tuple(d))


def chain_to_graph(chain: Chain) -> Graph:
    """The graph of a chain: every node costs what running it costs (docs/graphs.md).

    Nodes, in this order: ``a0`` (input, x_0 bytes); for each stage k < L, when
    s_k > x_{k+1}, ``R{k}`` (stage k's residuals: reads a_k, size s_k - x_{k+1}, cost
    fwd_time[k], tmp fwd_tmp[k] + x_{k+1}), then ``F{k}`` (reads a_k, size x_{k+1},
    cost fwd_time[k], tmp fwd_tmp[k]); ``loss`` (reads a_L, size x_L, cost
    fwd_time[L] + bwd_time[L], tmp bwd_tmp[L]); then ``B{k}`` for k = L-1 .. 0 (reads
    d_{k+1}, a_{k+1}, R{k}, a_k; size x_k, cost bwd_time[k], tmp bwd_tmp[k]).

    A node has one output, so the chain's recording forward ``F_all(k)``, which makes
    a_{k+1} *and* the residuals in one run, is two nodes here, each a run of stage k's
    forward: ``R{k}`` runs the forward and keeps only the residuals, its output a_{k+1}
    living as a temporary (hence tmp fwd_tmp[k] + x_{k+1}: the chain's F_all needs s_k
    + fwd_tmp[k] on top of what is resident, and so does ``R{k}``, and then ``F{k}``).
    Computing R{k} then F{k} therefore has F_all's peak and costs one more forward;
    :func:`chain_ops_to_graph` translates every chain schedule this way. When s_k <=
    x_{k+1} there is no R{k}: a_{k+1} is all stage k's backward reads (when s_k <
    x_{k+1}, not a real profile, the graph's abar is x_{k+1} > s_k bytes).
    """
    L = chain.length
    x = chain.in_size
    where = chain_nodes(chain)
    nodes = [Node("a0", 0.0, x[0], (), "input", 0)]
    for k in range(L):
        fwd, tmp = chain.fwd_time[k], chain.fwd_tmp[k]
        if where.res[k] is not None:
            residuals = chain.saved_size[k] - x[k + 1]
            nodes.append(Node(f"R{k}", fwd, residuals, (where.a[k],), "forward", tmp + x[k + 1]))
        nodes.append(Node(f"F{k}", fwd, x[k + 1], (where.a[k],), "forward", tmp))
    nodes.append(
        Node(
            "loss",
            chain.fwd_time[L] + chain.bwd_time[L],
            x[L],
            (where.a[L],),
            "backward",
            chain.bwd_tmp[L],
        )
    )
    for k in range(L - 1, -1, -1):
        reads = [where.d[k + 1], where.fwd[k]]
        if where.res[k] is not None:
            reads.append(where.res[k])
        reads.append(where.a[k])
        nodes.append(
            Node(f"B{k}", chain.bwd_time[k], x[k], tuple(reads), "backward", chain.bwd_tmp[k])
        )
    return Graph(tuple(nodes))


def chain_ops_to_graph(chain: Chain, ops: Iterable) -> tuple:
    """Translate a chain op sequence into graph ops on :func:`chain_to_graph` (chain).

    A chain buffer is a set of graph nodes (``a[k]``: {a_k}; ``abar[k]``: {R{k-1},
    F{k-1}}; ``d[k]``: {d_k}); a graph node is resident while some resident chain
    buffer contains it, computed when it becomes so (R before F) and freed when it
    stops being so. The result has a peak no larger than the chain schedule's and its
    makespan plus fwd_time[k] for every ``F_all(k)`` that computes both R{k} and F{k}
    (the graph runs stage k's forward twice where the chain records in one run), less
    when the chain recomputes a node the graph still holds. Raises
    :class:`InvalidSchedule` on ops the chain simulator would reject for missing inputs.
    """
    from schedir.chain.ops import B, F_all, F_ck, F_n, Loss

    L = chain.length
    w = chain_nodes(chain)

    def members(buf: tuple[str, int]) -> tuple[int, ...]:
        kind, k = buf
        if kind == "a":
            return (w.a[k],)
        if kind == "d":
            return (w.d[k],)
        return tuple(i for i in (w.res[k - 1], w.fwd[k - 1]) if i is not None)

    count: dict[int, int] = {0: 1}
    chain_res: set[tuple[str, int]] = {("a", 0)}
    out: list = []

    def add(buf: tuple[str, int]) -> None:
        chain_res.add(buf)
        for i in members(buf):
            if count.get(i, 0) == 0:
                out.append(Compute(i))
            count[i] = count.get(i, 0) + 1

    def remove(buf: tuple[str, int]) -> None:
        chain_res.discard(buf)
        for i in members(buf):
            count[i] -= 1
            if count[i] == 0:
                out.append(Free(i))

    def source(step: int, op, k: int) -> tuple[str, int]:
        for buf in (("a", k), ("abar", k)):
            if buf in chain_res:
                return buf
        raise InvalidSchedule(f"op {step}: {op}: needs a[{k}] or abar[{k}], neither is resident")

    for step, op in enumerate(ops):
        if isinstance(op, Loss):
            src = source(step, op, L)
            add(("d", L))
            if src[0] == "a":
                remove(src)
        elif isinstance(op, B):
            k = op.index
            for buf in (("d", k + 1), ("abar", k + 1)):
                if buf not in chain_res:
                    raise InvalidSchedule(f"op {step}: {op}: needs {buf[0]}[{buf[1]}]")
            src = source(step, op, k)
            add(("d", k))
            if src[0] == "a":
                remove(src)
            remove(("d", k + 1))
            remove(("abar", k + 1))
        elif isinstance(op, F_ck | F_n | F_all):
            k = op.index
            src = source(step, op, k)
            add(("abar" if isinstance(op, F_all) else "a", k + 1))
            if isinstance(op, F_n):
                remove(src)
        else:
            raise InvalidSchedule(f"op {step}: {op!r} is not a chain op")
    return tuple(out)


def dropped_recorded_inputs(chain: Chain, ops: Iterable) -> tuple[int, ...]:
    """Stages k at which a graph schedule of :func:`chain_to_graph` (chain) uses the
    freedom no chain op has (docs/graphs.md, "Graph methods against rotor"): a B{k}
    reads an a_{k+1} (F{k}) computed while a_k was resident, and a_k was freed in
    between. (The chain's ``F_all(k)`` keeps its input until ``B(k)``; ``F_n(k)``
    drops it but makes an a[k+1] that ``B(k)`` cannot read.)"""
    w = chain_nodes(chain)
    last: dict[int, int] = {}
    freed: dict[int, list[int]] = {}
    stages = []
    ops = [parse_graph_op(op) if isinstance(op, str) else op for op in getattr(ops, "ops", ops)]
    for t, op in enumerate(ops):
        if isinstance(op, Compute):
            last[op.node] = t
            if op.node in w.d[:-1]:
                k = w.d.index(op.node)
                if any(last[w.fwd[k]] < f < t for f in freed.get(w.a[k], [])):
                    stages.append(k)
        else:
            freed.setdefault(op.node, []).append(t)
    return tuple(stages)


# ------------------------------------------------------- graphs from forward DAGs


def forward_backward_graph(
    inputs: Mapping[str, int],
    forward: Sequence[Mapping],
    loss_cost: float = 0.0,
    loss_tmp: int = 0,
) -> Graph:
    """The training graph of a forward DAG (reverse-mode autodiff, one backward node per
    forward node).

    ``inputs`` maps input names to bytes. Each forward entry has ``name``, ``cost``
    (seconds), ``size`` (bytes), ``inputs`` (names), and optionally ``bwd_cost``
    (seconds, default 2 * cost), ``tmp`` and ``bwd_tmp`` (bytes). The loss node reads
    every forward node that no forward node reads (size: the sum of their sizes, the
    gradient). Backward node ``B{name}`` reads the gradient producers of its output
    (the backward nodes of its forward users, or the loss), its forward node and that
    node's inputs, and produces the gradients of its inputs (size: their sum). For a
    sequence this is exactly :func:`chain_to_graph`'s layout without residual nodes.
    """
    spec: list[dict] = [
        {"name": n, "kind": "input", "cost": 0.0, "size": s} for n, s in inputs.items()
    ]
    sizes = dict(inputs)
    users: dict[str, list[str]] = {n: [] for n in inputs}
    for f in forward:
        spec.append(
            {
                "name": f["name"],
                "kind": "forward",
                "cost": f["cost"],
                "size": f["size"],
                "tmp": f.get("tmp", 0),
                "inputs": list(f["inputs"]),
            }
        )
        sizes[f["name"]] = f["size"]
        users[f["name"]] = []
        for i in f["inputs"]:
            if i not in users:
                raise InvalidProblem(f"forward node {f['name']!r}: unknown input {i!r}")
            users[i].append(f["name"])
    sinks = [f["name"] for f in forward if not users[f["name"]]]
    spec.append(
        {
            "name": "loss",
            "kind": "backward",
            "cost": loss_cost,
            "size": sum(sizes[s] for s in sinks),
            "tmp": loss_tmp,
            "inputs": sinks,
        }
    )
    for f in reversed(forward):
        grads = [f"B{u}" for u in users[f["name"]]] or ["loss"]
        spec.append(
            {
                "name": f"B{f['name']}",
                "kind": "backward",
                "cost": f.get("bwd_cost", 2 * f["cost"]),
                "size": sum(sizes[i] for i in f["inputs"]),
                "tmp": f.get("bwd_tmp", 0),
                "inputs": grads + [f["name"]] + list(f["inputs"]),
            }
        )
    return build_graph(spec)


def skip_graph(layers: int, *, skip: int = 2, seed: int = 0, unet: bool = False) -> Graph:
    """A synthetic training graph with skip connections (tests and experiments).

    Layer i reads layer i-1 and, every ``skip`` layers, layer i-skip (residual
    blocks); with ``unet``, layer i of the second half reads its mirror layer of the
    first half instead. Costs in [1, 3) seconds, sizes in [4, 16) bytes, seeded.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    forward = []
    prev = "x"
    for i in range(layers):
        ins = [prev]
        if unet and i >= (layers + 1) // 2:
            mirror = layers - 1 - i
            if 0 <= mirror < i - 1:
                ins.append(f"L{mirror}")
        elif not unet and i >= skip and i % skip == 0:
            ins.append(f"L{i - skip}")
        cost = float(rng.uniform(1, 3))
        forward.append(
            {
                "name": f"L{i}",
                "cost": round(cost, 3),
                "bwd_cost": round(2 * cost, 3),
                "size": int(rng.integers(4, 16)),
                "inputs": ins,
            }
        )
        prev = f"L{i}"
    return forward_backward_graph({"x": int(rng.integers(4, 16))}, forward, loss_cost=1.0)
