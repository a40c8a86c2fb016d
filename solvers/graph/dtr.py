"""``dtr``: Dynamic Tensor Rematerialization as a policy (Kirisame, Lyubomirsky, Haan,
Brennan, He, Roesch, Chen, Tatlock, "Dynamic Tensor Rematerialization", ICLR 2021).

The graph's nodes run once each in their order (the "program"). Before a node
computes, its inputs are made resident, recomputing evicted ones on demand
(recursively; inputs being prepared are locked). When the new output and temporaries
would exceed the budget, the resident, unlocked, recomputable tensor of smallest

    h(t) = cost(t) / (size(t) * staleness(t))

is evicted (staleness: seconds of compute since its last use, plus a tiny epsilon),
until it fits. A tensor is freed for good once no node of the program still to run
reads it and no evicted tensor still needed needs it to be recomputed (DTR's reference
counting, with evicted tensors holding their parents). Input nodes cannot be
recomputed, so they are never evicted, and a tensor is evicted only if it can be
recomputed. The trace of computes and frees is the schedule.

``dtr_chain`` runs DTR on ``chain_to_graph(chain)`` (a graph schedule). The
:class:`OnDemandRunner` is shared with :mod:`solvers.graph_baselines`.
"""

from __future__ import annotations

from collections.abc import Callable

from schedir import Chain, Compute, Free, Graph, GraphSchedule, chain_to_graph
from solvers.registry import Infeasible, register

EPS = 1e-9


class _NoRoomError(Exception):
    """Raised inside the runner when nothing evictable is left."""


class OnDemandRunner:
    """Runs a graph's program, recomputing missing inputs on demand.

    Reference counting with recomputation: a node is *wanted* while a node still to run
    reads it (``refs``) or while a wanted node that is not resident (evicted or dropped,
    so to be recomputed) reads it (``pins``). A node that is not wanted is freed at
    once; a wanted one only by eviction (with a budget) or dropping (``drop``), after
    which it pins its own inputs, so that what it needs to be recomputed stays
    reachable: input nodes, which cannot be recomputed, stay resident while wanted.

    Args:
        graph: the graph.
        budget: bytes; None for no budget (then nothing is ever evicted).
        score: ``score(node, staleness)`` to minimize among eviction candidates.
        drop_after_forward: forward nodes to free once no *forward* node still to run
            reads them (checkpointing: they are recomputed for the backward).

    After a run, ``fit_max`` and ``over_min`` are the largest memory need that fit the
    budget and the smallest that did not (bytes; None if none): the run, success or
    failure, is the same under every budget in ``[fit_max, over_min - 1]``.
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
        self.pins = [0] * n
        self.pinning = [False] * n  # node i holds a pin on each of its inputs
        self.evictions = 0
        self.fit_max: int | None = None
        self.over_min: int | None = None

    def wanted(self, i: int) -> bool:
        return self.refs[i] > 0 or self.pins[i] > 0

    def _settle(self, i: int) -> None:
        """Restore the invariants at node i: a missing wanted node pins its inputs, a
        resident or unwanted one does not; a resident, unlocked, unwanted one is freed."""
        hold = not self.resident[i] and self.wanted(i) and self.g.nodes[i].kind != "input"
        if hold != self.pinning[i]:
            self.pinning[i] = hold
            for j in self.g.nodes[i].inputs:
                self.pins[j] += 1 if hold else -1
                self._settle(j)
        if self.resident[i] and not self.locked[i] and not self.wanted(i):
            self._free(i)

    def _free(self, i: int) -> None:
        self.resident[i] = False
        self.mem -= self.g.nodes[i].size
        self.ops.append(Free(i))
        self._settle(i)

    def _recomputable(self, i: int, memo: dict[int, bool]) -> bool:
        """Whether node i, once missing, can be computed again from what is resident or
        itself recomputable (input nodes are not)."""
        if i not in memo:
            memo[i] = False  # the graph is acyclic: only guards the recursion
            node = self.g.nodes[i]
            memo[i] = node.kind != "input" and all(
                self.resident[j] or self.pinning[j] or self._recomputable(j, memo)
                for j in node.inputs
            )
        return memo[i]

    def _fits(self, need: int) -> bool:
        fits = self.budget is None or need <= self.budget
        if self.budget is not None:
            if fits:
                self.fit_max = need if self.fit_max is None else max(self.fit_max, need)
            else:
                self.over_min = need if self.over_min is None else min(self.over_min, need)
        return fits

    def _make_room(self, extra: int) -> None:
        memo: dict[int, bool] = {}
        while not self._fits(self.mem + extra):
            best, best_h = None, None
            for i, node in enumerate(self.g.nodes):
                if not self.resident[i] or self.locked[i] or node.kind == "input" or node.size == 0:
                    continue
                if not self._recomputable(i, memo):
                    continue
                h = self.score(i, self.clock - self.last[i] + EPS)
                if best_h is None or h < best_h:
                    best, best_h = i, h
            if best is None:
                raise _NoRoomError
            self.evictions += 1
            self._free(best)
            memo.clear()

    def materialize(self, v: int) -> None:
        """Make node v resident (computing it and, first, its missing inputs)."""
        if self.resident[v]:
            self.last[v] = self.clock
            return
        node = self.g.nodes[v]
        if node.kind == "input":  # pragma: no cover - wanted inputs are never freed
            raise RuntimeError(f"input node {node.name} was freed while still needed")
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
        self._settle(v)
        for j in node.inputs:  # recomputed helpers that nothing wants any more
            self._settle(j)

    def run(self) -> tuple:
        """Execute the program; returns the ops (raises ``_NoRoomError`` when stuck)."""
        g = self.g
        for v in g.computed:
            self.materialize(v)
            node = g.nodes[v]
            self.locked[v] += 1  # v's own output is settled after its inputs
            for j in node.inputs:
                self.refs[j] -= 1
                if node.kind == "forward":
                    self.fwd_refs[j] -= 1
            for j in node.inputs:
                dropped = node.kind == "forward" and j in self.drop and self.fwd_refs[j] == 0
                if dropped and self.resident[j] and not self.locked[j]:
                    if self._recomputable(j, {}):  # else keep it: its sources are gone
                        self._free(j)
                self._settle(j)
            self.locked[v] -= 1
            self._settle(v)
        return tuple(self.ops)


def _h(graph: Graph) -> Callable[[int, float], float]:
    nodes = graph.nodes
    return lambda i, stale: nodes[i].cost / (nodes[i].size * stale)


def _dtr_run(graph: Graph, budget: int) -> OnDemandRunner:
    """DTR's runner after a run at ``budget``; ``runner.ops`` is None when it got stuck."""
    runner = OnDemandRunner(graph, budget, _h(graph))
    try:
        runner.ops = list(runner.run())
    except _NoRoomError:
        runner.ops = None
    return runner


def _dtr_ops(graph: Graph, budget: int) -> tuple | None:
    ops = _dtr_run(graph, budget).ops
    return None if ops is None else tuple(ops)


def memory_lower_bound(graph: Graph) -> int:
    """Bytes every schedule needs: the inputs resident at the start, and for each node
    its output, its temporary and its inputs while it computes."""
    nodes = graph.nodes
    return max(
        sum(nodes[i].size for i in graph.inputs),
        *(
            n.size + n.tmp + sum(nodes[j].size for j in n.inputs)
            for n in nodes
            if n.kind != "input"
        ),
    )


def dtr_min_budget(graph: Graph) -> int:
    """The least budget under which DTR succeeds (exact).

    DTR's run depends on the budget only through comparisons "memory needed <= budget",
    so a run under budget b is the same under every budget up to (not including) the
    smallest need that did not fit. Starting from :func:`memory_lower_bound`, each
    failed run jumps there; the first run that succeeds is at the least budget (DTR is
    not monotone in the budget, so bisection could miss it)."""
    budget = memory_lower_bound(graph)
    while True:
        run = _dtr_run(graph, budget)
        if run.ops is not None:
            return budget
        if run.over_min is None:  # pragma: no cover - a stuck run always overflowed
            raise RuntimeError("dtr: stuck without exceeding the budget")
        budget = run.over_min


@register(
    "dtr",
    problem=Graph,
    exact=False,
    description="Dynamic Tensor Rematerialization (Kirisame et al. 2021): greedy eviction by h",
)
def dtr(graph: Graph, budget: int) -> GraphSchedule:
    """DTR's eviction trace under ``budget`` bytes.

    DTR may get stuck under a budget and succeed under a smaller one (it is not
    monotone); then the run under the least budget at which it succeeds
    (:func:`dtr_min_budget`) is returned, ``meta["run_budget"]`` says which. Raises
    :class:`Infeasible` with that least budget (exact) when it is above ``budget``."""
    run = _dtr_run(graph, budget)
    run_budget = budget
    if run.ops is None:
        least = dtr_min_budget(graph)
        if least > budget:
            raise Infeasible("dtr", budget, least, "the least budget under which DTR succeeds")
        run, run_budget = _dtr_run(graph, least), least
    return GraphSchedule(
        tuple(run.ops),
        {
            "exact": False,
            "evictions": run.evictions,
            "policy": "h = cost/(size*staleness)",
            "run_budget": run_budget,
        },
    )


def dtr_chain(chain: Chain, budget: int) -> GraphSchedule:
    """DTR on a chain, through ``chain_to_graph(chain)``: returns a *graph* schedule of
    that graph (same time and memory units as the chain)."""
    return dtr(chain_to_graph(chain), budget)
