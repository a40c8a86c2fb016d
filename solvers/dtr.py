"""``dtr``: Dynamic Tensor Rematerialization as a policy (Kirisame, Lyubomirsky, Haan,
Brennan, He, Roesch, Chen, Tatlock, "Dynamic Tensor Rematerialization", ICLR 2021).

The graph's nodes run once each in their order (the "program"). Before a node
computes, its inputs are made resident, recomputing evicted ones on demand
(recursively; inputs being prepared are locked). When the new output and temporaries
would exceed the budget, the resident, unlocked, recomputable tensor of smallest

    h(t) = cost(t) / (size(t) * staleness(t))

is evicted (staleness: seconds of compute since its last use, plus a tiny epsilon),
until it fits. A tensor is freed for good once every node of the program that reads
it has run (DTR's reference counting). Input nodes cannot be recomputed, so they are
never evicted. The trace of computes and frees is the schedule.

``dtr_chain`` runs DTR on ``chain_to_graph(chain)`` (a graph schedule). The
:class:`OnDemandRunner` is shared with :mod:`solvers.graph_baselines`.
"""

from __future__ import annotations

from collections.abc import Callable

from schedir import Chain, Compute, Free, Graph, GraphSchedule, chain_to_graph, simulate_graph
from solvers.registry import Infeasible, register

EPS = 1e-9


class _NoRoomError(Exception):
    """Raised inside the runner when nothing evictable is left."""


class OnDemandRunner:
    """Runs a graph's program, recomputing missing inputs on demand.

    Args:
        graph: the graph.
        budget: bytes; None for no budget (then nothing is ever evicted).
        score: ``score(node, staleness)`` to minimize among eviction candidates.
        drop_after_forward: forward nodes to free once no *forward* node still to run
            reads them (checkpointing: they are recomputed for the backward).
    """

    def __init__(
        self,
        graph: Graph,
        budget: int | None,
        score: Callable[[int, float], float] | None = None,
        drop_after_forward: frozenset[int] = frozenset(),
    ) -> None:
        self.g = graph
        self.budget = budget
        self.score = score
        self.drop = drop_after_forward
        n = len(graph)
        self.resident = [False] * n
        self.mem = 0
        for i in graph.inputs:
            self.resident[i] = True
            self.mem += graph.nodes[i].size
        self.peak = self.mem
        self.locked = [0] * n
        self.last = [0.0] * n
        self.clock = 0.0
        self.ops: list = []
        self.refs = [len(u) for u in graph.users]
        self.fwd_refs = [sum(graph.nodes[u].kind == "forward" for u in us) for us in graph.users]
        self.evictions = 0

    def _free(self, i: int) -> None:
        self.resident[i] = False
        self.mem -= self.g.nodes[i].size
        self.ops.append(Free(i))

    def _make_room(self, extra: int) -> None:
        if self.budget is None:
            return
        while self.mem + extra > self.budget:
            best, best_h = None, None
            for i, node in enumerate(self.g.nodes):
                if not self.resident[i] or self.locked[i] or node.kind == "input" or node.size == 0:
                    continue
                h = self.score(i, self.clock - self.last[i] + EPS)
                if best_h is None or h < best_h:
                    best, best_h = i, h
            if best is None:
                raise _NoRoomError
            self._free(best)
            self.evictions += 1

    def materialize(self, v: int) -> None:
        """Make node v resident (computing it and, first, its missing inputs)."""
        if self.resident[v]:
            self.last[v] = self.clock
            return
        node = self.g.nodes[v]
        if node.kind == "input":  # pragma: no cover - inputs are never evicted
            raise _NoRoomError
        done = []
        try:
            for j in node.inputs:
                self.materialize(j)
                self.locked[j] += 1
                done.append(j)
            self._make_room(node.size + node.tmp)
            self.resident[v] = True
            self.mem += node.size
            self.peak = max(self.peak, self.mem + node.tmp)
            self.ops.append(Compute(v))
            self.clock += node.cost
            self.last[v] = self.clock
            for j in node.inputs:
                self.last[j] = self.clock
        finally:
            for j in done:
                self.locked[j] -= 1
        for j in node.inputs:  # recomputed helpers that nothing still to run reads
            if self.resident[j] and self.refs[j] == 0 and not self.locked[j]:
                self._free(j)

    def run(self) -> tuple:
        """Execute the program; returns the ops (raises ``_NoRoomError`` when stuck)."""
        g = self.g
        for v in g.computed:
            self.materialize(v)
            node = g.nodes[v]
            for j in node.inputs:
                self.refs[j] -= 1
                if node.kind == "forward":
                    self.fwd_refs[j] -= 1
            for j in (*node.inputs, v):
                if not self.resident[j]:
                    continue
                dead = self.refs[j] == 0
                dropped = node.kind == "forward" and j in self.drop and self.fwd_refs[j] == 0
                if dead or dropped:
                    self._free(j)
            for j in range(len(g)):  # recomputed helpers nobody will read again
                if self.resident[j] and self.refs[j] == 0 and not self.locked[j]:
                    self._free(j)
        return tuple(self.ops)


def _h(graph: Graph) -> Callable[[int, float], float]:
    nodes = graph.nodes
    return lambda i, stale: nodes[i].cost / (nodes[i].size * stale)


def _dtr_ops(graph: Graph, budget: int) -> tuple | None:
    runner = OnDemandRunner(graph, budget, _h(graph))
    try:
        ops = runner.run()
    except _NoRoomError:
        return None
    return ops


def dtr_min_budget(graph: Graph) -> int:
    """The least budget under which DTR succeeds, found by bisection between a lower
    bound (every node with its inputs, temporaries and the graph's inputs) and the
    no-eviction peak. DTR's success is not proven monotone in the budget, so this is
    the least budget *found*; DTR is verified to succeed there."""
    nodes = graph.nodes
    base = sum(nodes[i].size for i in graph.inputs)
    lo = max(
        base + n.size + n.tmp + sum(nodes[j].size for j in n.inputs if nodes[j].kind != "input")
        for n in (nodes[i] for i in graph.computed)
    )
    hi = simulate_graph(graph, OnDemandRunner(graph, None).run()).peak_memory
    if _dtr_ops(graph, lo) is not None:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _dtr_ops(graph, mid) is None:
            lo = mid
        else:
            hi = mid
    return hi


@register(
    "dtr",
    problem=Graph,
    exact=False,
    description="Dynamic Tensor Rematerialization (Kirisame et al. 2021): greedy eviction by h",
)
def dtr(graph: Graph, budget: int) -> GraphSchedule:
    """DTR's eviction trace under ``budget`` bytes; :class:`Infeasible` (with the least
    budget found by :func:`dtr_min_budget`) when even evicting everything evictable
    cannot make room."""
    runner = OnDemandRunner(graph, budget, _h(graph))
    try:
        ops = runner.run()
    except _NoRoomError:
        least = dtr_min_budget(graph)
        raise Infeasible(
            "dtr", budget, least, "least budget found by bisection; DTR is a heuristic"
        ) from None
    return GraphSchedule(
        ops, {"evictions": runner.evictions, "policy": "h = cost/(size*staleness)"}
    )


def dtr_chain(chain: Chain, budget: int) -> GraphSchedule:
    """DTR on a chain, through ``chain_to_graph(chain)``: returns a *graph* schedule of
    that graph (same time and memory units as the chain)."""
    return dtr(chain_to_graph(chain), budget)
