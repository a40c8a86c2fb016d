"""Pareto-optimal save sets of one block: a small MILP per distinct block (docs/auto.md).

The block is a graph of equations (nodes) in order. Some of the values they make are
*candidates* (materialized: a save set may hold them); the backward of a node reads
some values (its residuals). A save set S and a recompute set R are consistent when
every value the backward reads is saved (candidates only) or made by a node of R,
every input of a node of R is too, and every *self-recomputed* node (one whose
backward needs values JAX cannot save under a names policy: its own output or new
JVP values) is in R. Given S, the least R is a closure (:func:`recompute_set`).

:func:`pareto_save_sets` solves with HiGHS (highspy, as :mod:`solvers.graph.checkmate_milp`
does: a model has one small MILP per distinct block, built once and solved for each
cap, so HiGHS's set-up is paid once per block)

    min  sum_i cost_i r_i + eps * sum_c size_c s_c
    s.t. s_c + r_{node(c)} >= 1            for every candidate c read by a backward
         r_n >= 1                           for every other value read (made by n)
         s_c + r_{node(c)} >= r_i           for every candidate input c of i
         r_n >= r_i                         for every other input of i (made by n)
         r_i = 1                            for self-recomputed nodes
         sum_c size_c s_c <= cap

for caps swept from all candidates' bytes to 0 (each next cap just below the last
answer's saved bytes, an epsilon-constraint sweep), which yields Pareto points
(saved bytes, recomputation time) from "save all" to "save nothing"; each answer is
reduced to the values its closure reads.

Refs: a value is a candidate index c >= 0, or ``-1 - n`` for a non-candidate value
made by node n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from schedir import InvalidProblem
from solvers._highs import binary_model, run, solution


@dataclass(frozen=True)
class OptionGraph:
    """A block's equations for the save-set MILP.

    Attributes:
        cost: seconds to (re)compute each node.
        inputs: per node, the refs of the values it reads that the block makes.
        values: per candidate, the node that makes it.
        value_sizes: per candidate, bytes.
        needs: per node, refs of the values its backward reads (block-made only).
        self_recompute: per node, whether its backward recomputes it regardless.
    """

    cost: tuple[float, ...]
    inputs: tuple[tuple[int, ...], ...]
    values: tuple[int, ...]
    value_sizes: tuple[int, ...]
    needs: tuple[tuple[int, ...], ...]
    self_recompute: tuple[bool, ...]

    def __post_init__(self) -> None:
        n = len(self.cost)
        for name in ("inputs", "needs", "self_recompute"):
            if len(getattr(self, name)) != n:
                raise InvalidProblem(
                    f"OptionGraph.{name} has {len(getattr(self, name))} entries, cost {n}"
                )
        if len(self.values) != len(self.value_sizes):
            raise InvalidProblem("OptionGraph.values and value_sizes differ in length")
        for c, node in enumerate(self.values):
            if not 0 <= node < n:
                raise InvalidProblem(f"OptionGraph.values[{c}] = {node}: not a node")
        for i, refs in enumerate(self.inputs + self.needs):
            for r in refs:
                if not (0 <= r < len(self.values) or 0 <= -1 - r < n):
                    raise InvalidProblem(
                        f"OptionGraph: ref {r} (node {i % n}) is neither a candidate nor a node"
                    )

    def maker(self, ref: int) -> int:
        return self.values[ref] if ref >= 0 else -1 - ref


def recompute_set(graph: OptionGraph, saved: set[int] | frozenset[int]) -> set[int]:
    """The least set of nodes the backward recomputes when candidates ``saved`` are kept."""
    todo = [r for refs in graph.needs for r in refs]
    rec = {i for i, s in enumerate(graph.self_recompute) if s}
    for i in rec:
        todo.extend(graph.inputs[i])
    while todo:
        ref = todo.pop()
        if ref >= 0 and ref in saved:
            continue
        node = graph.maker(ref)
        if node not in rec:
            rec.add(node)
            todo.extend(graph.inputs[node])
    return rec


def read_values(graph: OptionGraph, saved: set[int]) -> set[int]:
    """The saved candidates the backward actually reads (the rest need not be kept)."""
    rec = recompute_set(graph, saved)
    reads = {r for refs in graph.needs for r in refs}
    for i in rec:
        reads.update(graph.inputs[i])
    return {r for r in reads if r >= 0 and r in saved}


def consistency_rows(graph: OptionGraph):
    """Constraint rows over x = (s_0..s_{nv-1}, r_0..r_{n-1}): ``A x >= lb`` rows."""
    nv, n = len(graph.values), len(graph.cost)
    rows, cols, vals, lbs = [], [], [], []

    def avail(row: int, ref: int, coef: float = 1.0) -> None:
        if ref >= 0:
            rows.extend((row, row)), cols.extend((ref, nv + graph.values[ref]))
            vals.extend((coef, coef))
        else:
            rows.append(row), cols.append(nv + (-1 - ref)), vals.append(coef)

    r = 0
    for i in range(n):
        for ref in graph.needs[i]:
            avail(r, ref)
            lbs.append(1.0)
            r += 1
        for ref in graph.inputs[i]:
            avail(r, ref)
            rows.append(r), cols.append(nv + i), vals.append(-1.0)
            lbs.append(0.0)
            r += 1
    A = sp.csr_matrix((vals, (rows, cols)), shape=(r, nv + n))
    return A, np.asarray(lbs)


# HiGHS stops after this many branch-and-bound nodes: a deterministic work limit, so that
# an answer depends on the problem alone, never on the machine's load (a wall-clock limit
# would). The save-set MILPs of the example models close in a few hundred nodes.
NODE_LIMIT = 20_000


# The relative gap at which HiGHS stops (its default): a save set may recompute more
# than the optimum by up to that share of the block's time; proving 1e-6 takes the
# sweeps of the zoo's blocks 2.4x as long and changed none of their answers.
REL_GAP = 1e-4


def check_node_limit(node_limit: int) -> int:
    if isinstance(node_limit, bool) or not isinstance(node_limit, int) or node_limit < 1:
        raise ValueError(f"node_limit = {node_limit!r}: expected an int >= 1 (HiGHS nodes)")
    return node_limit


def milp_options(node_limit: int = NODE_LIMIT, time_limit: float | None = None) -> dict:
    """``scipy.optimize.milp`` options: the deterministic node limit, and a wall-clock
    limit only when asked for (an answer stopped by it depends on the machine's load)."""
    options: dict = {"node_limit": check_node_limit(node_limit)}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    return options


def pareto_save_sets(
    graph: OptionGraph, max_points: int = 4, *, node_limit: int = NODE_LIMIT
) -> list[frozenset[int]]:
    """Up to ``max_points`` Pareto-optimal save sets strictly between "all" and "none"
    (module docstring), most saved first. Solved with HiGHS, one model whose cap is
    lowered from solve to solve, within ``node_limit`` nodes each (deterministic; a save
    set found at the limit is kept although not proven Pareto-optimal)."""
    nv, n = len(graph.values), len(graph.cost)
    if nv == 0 or max_points <= 0:
        return []
    A, lb = consistency_rows(graph)
    sizes = np.asarray(graph.value_sizes, dtype=float)
    total = float(sizes.sum()) or 1.0
    scale = float(sum(graph.cost)) or 1.0
    c = np.concatenate([1e-6 * sizes / total, np.asarray(graph.cost) / scale])
    lower = np.zeros(nv + n)
    lower[nv:] = np.asarray(graph.self_recompute, dtype=float)  # r_i = 1 for those
    cap_row = sp.csr_matrix(np.concatenate([sizes, np.zeros(n)])[None, :])
    h = binary_model(c, sp.vstack([A, cap_row]), np.append(lb, -np.inf),
                     np.append(np.full(len(lb), np.inf), total), lower,
                     node_limit=check_node_limit(node_limit), rel_gap=REL_GAP)  # fmt: skip
    t_none = sum(graph.cost[i] for i in recompute_set(graph, set()))
    found: list[frozenset[int]] = []
    times: list[float] = []
    limit = total
    for _ in range(3 * max_points):
        h.changeRowBounds(len(lb), -np.inf, limit)  # the cap row, last
        run(h)
        x = solution(h)
        if x is None:
            break
        saved = read_values(graph, {j for j in range(nv) if x[j] > 0.5})
        used = float(sizes[sorted(saved)].sum()) if saved else 0.0
        t = sum(graph.cost[i] for i in recompute_set(graph, saved))
        if saved and t < t_none and all(abs(t - u) > 1e-15 for u in times):
            found.append(frozenset(saved))
            times.append(t)
        if used <= 0:
            break
        limit = used - 1
    found = [f for f in found if f != frozenset(range(nv))]
    if len(found) > max_points:  # keep an even spread of saved bytes
        picks = np.linspace(0, len(found) - 1, max_points).round().astype(int)
        found = [found[i] for i in sorted(set(picks))]
    return found
