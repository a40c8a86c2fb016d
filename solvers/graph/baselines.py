"""Budget-independent graph baselines: ``store_all`` and ``chen_sqrt`` for graphs.

- ``store_all``: run every node once in order, free each output once nothing still to
  run reads it. No recomputation; the most memory.
- ``chen_sqrt``: Chen, Xu, Zhang, Guestrin, "Training deep nets with sublinear memory
  cost" (2016), for graphs: the forward nodes at which the forward graph has a single
  live output (articulation points of the forward pass) are candidate checkpoints;
  about every sqrt(#forward nodes)-th forward node a candidate is kept. Other forward
  outputs are freed once no forward node still needs them, and are recomputed on demand
  from the nearest resident ancestors when a backward node needs them (the recomputed
  segment stays until its backward is done).

Both are fixed schedules: if their peak exceeds the budget they raise
:class:`Infeasible` with ``min_budget`` = that peak (exact for these methods).
"""

from __future__ import annotations

import math

from schedir import Graph, GraphSchedule
from solvers.graph.dtr import OnDemandRunner
from solvers.registry import fixed_schedule, register


def store_all_graph_ops(graph: Graph) -> tuple:
    """Every node once, in order, freeing outputs when dead."""
    return OnDemandRunner(graph, None).run()


def checkpoint_candidates(graph: Graph) -> list[int]:
    """Forward nodes v such that, at some point of the forward pass, v is the only
    computed forward output still read by a forward node to run (the forward graph's
    cut vertices, in order)."""
    nodes = graph.nodes
    fwd = [i for i in graph.computed if nodes[i].kind == "forward"]
    remaining = [sum(nodes[u].kind == "forward" for u in us) for us in graph.users]
    live: set[int] = set()
    out: list[int] = []
    for v in fwd:
        for j in nodes[v].inputs:
            remaining[j] -= 1
            if remaining[j] == 0:
                live.discard(j)
        if remaining[v] > 0:
            live.add(v)
        forward_live = {i for i in live if nodes[i].kind == "forward"}
        if len(forward_live) == 1:
            (c,) = forward_live
            if not out or out[-1] != c:
                out.append(c)
    return out


def chen_checkpoints(graph: Graph, segment: int | None = None) -> list[int]:
    """Checkpoints: a candidate at least every ``segment`` (default ceil(sqrt(#forward)))
    forward nodes."""
    nodes = graph.nodes
    fwd = [i for i in graph.computed if nodes[i].kind == "forward"]
    seg = segment or max(1, math.ceil(math.sqrt(len(fwd))))
    order = {v: p for p, v in enumerate(fwd)}
    chosen, last = [], -1
    for c in checkpoint_candidates(graph):
        if order[c] - last >= seg:
            chosen.append(c)
            last = order[c]
    return chosen


def chen_sqrt_graph_ops(graph: Graph, segment: int | None = None) -> tuple:
    keep = set(chen_checkpoints(graph, segment))
    drop = frozenset(
        i for i in graph.computed if graph.nodes[i].kind == "forward" and i not in keep
    )
    return OnDemandRunner(graph, None, drop_after_forward=drop).run()


def _fixed(name: str, graph: Graph, budget: int, ops: tuple, meta: dict) -> GraphSchedule:
    return fixed_schedule(name, graph, GraphSchedule(ops, {"exact": False, **meta}), budget)


@register(
    "store_all",
    problem=Graph,
    exact=False,
    description="every node once, outputs freed when dead (no recomputation)",
    fixed=True,
)
def store_all_graph(graph: Graph, budget: int) -> GraphSchedule:
    return _fixed("store_all", graph, budget, store_all_graph_ops(graph), {})


@register(
    "chen_sqrt",
    problem=Graph,
    exact=False,
    description="Chen et al. 2016 sqrt(n) checkpoints at articulation points of the forward",
    fixed=True,
)
def chen_sqrt_graph(graph: Graph, budget: int, *, segment: int | None = None) -> GraphSchedule:
    ops = chen_sqrt_graph_ops(graph, segment)
    cps = chen_checkpoints(graph, segment)
    return _fixed(
        "chen_sqrt", graph, budget, ops, {"checkpoints": [graph.nodes[i].name for i in cps]}
    )
