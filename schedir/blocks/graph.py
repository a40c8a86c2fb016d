"""A block chain with one option per stage as a graph (docs/auto.md, "Graph methods").

Graph methods (Checkmate's MILP, DTR, ...: docs/graphs.md) schedule a
:class:`~schedir.graph.Graph`. :func:`block_graph` gives the one of a
:class:`~schedir.blocks.BlockChain` whose simulated memory is, to the byte, what the
op-by-op runtime of ``jax_exec.auto`` holds when it runs the graph's ops (values by
identity, as in the block chain: a value read several stages later is made once, by
its stage's forward node). Nodes, in this order:

- ``a0`` (an input node holding ``cuts[0]``) when ``cuts[0]`` is not empty;
- per stage k < L: ``R{k}`` when its option saves residuals (size ``saved``; the
  recording forward, whose outputs are temporaries: tmp ``rec_tmp`` plus the bytes of
  the values stage k makes; cost ``rec_time``), then ``F{k}`` (the values stage k
  makes: size their bytes, tmp ``fwd_tmp``, cost ``fwd_time``); both read the nodes
  that make the values stage k reads;
- ``loss`` (reads what makes ``cuts[L]``; size: the cotangents of ``d[L]``; tmp
  ``loss_tmp``; cost ``loss_time``);
- ``B{k}`` for k = L-1 .. 0: the cotangents of the values stage k reads (size: those
  with a cotangent); it reads the makers of those values, ``F{k}``, ``R{k}``, and the
  nodes that made the cotangents of its values and of the read values it passes on
  (the next reader's backward, or the loss); tmp ``bwd_tmp`` (its inputs stay resident
  until freed: no ``bwd_release``), cost ``bwd_time``.

A chain records a stage in one run (``F_all``) where the graph runs ``R{k}`` and
``F{k}``: every forward of a stage with residuals runs twice in the graph's store-all
(Checkmate's nodes have one output each; docs/graphs.md, "Chains as graphs").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedir.blocks.problem import BlockChain
from schedir.graph.problem import Graph, Node


@dataclass(frozen=True)
class BlockNodes:
    """Where each buffer of a block chain lives in :func:`block_graph`.

    Attributes:
        options: the option of every stage.
        fwd: ``fwd[k]``: node ``F{k}``; ``res[k]``: node ``R{k}`` or None.
        loss: node ``loss``; ``bwd[k]``: node ``B{k}``.
        maker: value id -> the node holding it (``F{k}`` of the stage that makes it,
            or ``a0``).
        grad: ``(value, stage)`` -> the node holding the value's cotangent made by that
            stage's backward (stage L: the loss).
    """

    options: tuple[int, ...]
    fwd: tuple[int, ...]
    res: tuple[int | None, ...]
    loss: int
    bwd: tuple[int, ...]
    maker: dict
    grad: dict

    def role(self, i: int) -> tuple[str, int]:
        """``(kind, stage)`` of node i: kind ``"a0"``, ``"fwd"``, ``"res"``, ``"loss"``
        or ``"bwd"``."""
        if i == self.loss:
            return "loss", len(self.fwd)
        for kind, nodes in (("fwd", self.fwd), ("res", self.res), ("bwd", self.bwd)):
            if i in nodes:
                return kind, nodes.index(i)
        return "a0", 0


def block_graph(problem: BlockChain, options: Sequence[int]) -> tuple[Graph, BlockNodes]:
    """The graph of ``problem`` with stage k under option ``options[k]`` (module doc)."""
    opts = problem.check_options(options)
    L, size, gsize = problem.length, problem.value_sizes, problem.grad_sizes
    nodes: list[Node] = []
    maker: dict[int, int] = {}
    if problem.cuts[0]:
        nodes.append(Node("a0", 0.0, sum(size[v] for v in problem.cuts[0]), (), "input", 0))
        maker.update({v: 0 for v in problem.cuts[0]})
    fwd, res = [], []
    for k, stage in enumerate(problem.stages):
        option = stage.options[opts[k]]
        made = sorted(problem.produced[k])
        reads = tuple(sorted({maker[v] for v in stage.reads}))
        out_bytes = sum(size[v] for v in made)
        if option.saved > 0:
            res.append(len(nodes))
            nodes.append(Node(f"R{k}", option.rec_time, option.saved, reads, "forward",
                              option.rec_tmp + out_bytes))  # fmt: skip
        else:
            res.append(None)
        fwd.append(len(nodes))
        nodes.append(Node(f"F{k}", stage.fwd_time, out_bytes, reads, "forward", stage.fwd_tmp))
        maker.update({v: fwd[-1] for v in made})
    loss = len(nodes)
    grad: dict[tuple[int, int], int] = {}
    cut_l = problem.cuts[L]
    nodes.append(Node("loss", problem.loss_time, sum(gsize[v] for v in cut_l),
                      tuple(sorted({maker[v] for v in cut_l})), "backward",
                      problem.loss_tmp))  # fmt: skip
    grad.update({(v, L): loss for v in cut_l if gsize[v]})
    bwd = [0] * L
    for k in range(L - 1, -1, -1):
        stage = problem.stages[k]
        option = stage.options[opts[k]]

        def reader(v: int, after: int) -> int:
            return next((r for r in range(after, L) if v in problem.stages[r].reads), L)

        reads = {maker[v] for v in stage.reads} | {fwd[k]}
        if res[k] is not None:
            reads.add(res[k])
        for v in problem.cuts[k + 1]:  # cotangents of what it makes and passes on
            if gsize[v] and (v in problem.produced[k] or v in stage.reads):
                reads.add(grad[v, reader(v, k + 1)])
        bwd[k] = len(nodes)
        mine = [v for v in stage.reads if gsize[v]]
        nodes.append(Node(f"B{k}", option.bwd_time, sum(gsize[v] for v in mine),
                          tuple(sorted(reads)), "backward", option.bwd_tmp))  # fmt: skip
        grad.update({(v, k): bwd[k] for v in mine})
    where = BlockNodes(opts, tuple(fwd), tuple(res), loss, tuple(bwd), maker, grad)
    return Graph(tuple(nodes)), where
