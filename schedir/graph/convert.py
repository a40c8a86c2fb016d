"""Chains as graphs: :func:`chain_to_graph` converts a :class:`~schedir.chain.Chain` to a
Graph whose nodes cost what running them costs (one-output nodes: the recording
forward is two nodes, see its docstring), and :func:`chain_ops_to_graph` translates
any chain schedule into a graph schedule that the graph simulator accepts with no
larger peak. The graph kind registers :func:`chain_to_graph` as the reduction
``chain -> graph`` (``schedir.kind.convert``, ``Chain.to_graph``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schedir.chain.ops import effect
from schedir.chain.problem import Chain
from schedir.chain.schedule import as_ops
from schedir.errors import InvalidSchedule
from schedir.graph.ops import Compute, Free, parse_graph_op
from schedir.graph.problem import Graph, Node


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

    for step, op in enumerate(as_ops(ops)):
        try:
            eff = effect(chain, op, chain_res)  # the chain op table, docs/semantics.md
        except InvalidSchedule as err:
            raise InvalidSchedule(f"op {step}: {op}: {err}") from None
        for buf in eff.adds:
            add(buf)
        for buf in eff.frees:
            remove(buf)
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
