"""The whole-graph save-set MILP: every block's save set chosen jointly (docs/auto.md,
"The whole-graph MILP").

The block DP (:mod:`solvers.blocks.rotor`) chooses, per block, one of a few save sets
found for the block alone (:func:`solvers.blocks.options.pareto_save_sets`). This MILP
instead decides every materialized value of every block at once, for the schedule that
``jax.checkpoint`` with a names policy around each block runs: every block recorded
once (``F_all``), keeping its save set, then the backward, each block recomputing what
it did not save inside its own backward. As Checkmate's MILP (Jain et al., "Checkmate:
breaking the memory wall with optimal tensor rematerialization", MLSys 2020) it sees the
whole graph and the memory of every step; unlike Checkmate, its recomputations stay
where JAX's lowering puts them, so that every answer compiles.

Per position k of the chain (a block; positions of one ``group`` share their variables,
as the blocks of one scanned loop must), with the block's
:class:`~solvers.blocks.options.OptionGraph` (save ``s``, recompute ``r``; the same
consistency rows as the per-block MILP)::

    min  sum_k sum_i cost_{k,i} r_{k,i}  (+ a tie-break of 1e-6 on the saved bytes)
    F(k):  fwd_base_k + sum_{j <= k} saved_j             <= budget
    B(k):  bwd_base_k + sum_{j <= k} saved_j + rec_k     <= budget
    loss:  loss_base  + sum_{j < L}  saved_j             <= budget

with ``saved_j = sum_c size_c s_{j,c}`` and ``rec_k = sum_i node_bytes_{k,i} r_{k,i}``
(the bytes a backward holds for what it recomputes). The ``*_base`` bytes are what each
step needs besides those: cut values, cotangents, kernel temporaries, calibrated by the
caller against an exactly priced schedule (:mod:`jax_exec.auto.whole`). The model is
linear, hence an estimate of the block chain's simulator; the caller prices every
answer exactly before it is used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from schedir import InvalidProblem
from solvers.blocks.options import (
    NODE_LIMIT,
    OptionGraph,
    consistency_rows,
    milp_options,
    read_values,
    recompute_set,
)
from solvers.registry import Infeasible


@dataclass(frozen=True)
class SaveSetChain:
    """The whole-graph MILP's data (module docstring); bytes and seconds.

    Attributes:
        graphs: per position, its block's graph.
        groups: per position, the id of the variables it uses (positions with one id
            share their save set and must share their graph).
        node_bytes: per position, per node, bytes its backward holds when it recomputes
            the node.
        fwd_base: per position, bytes its recording needs besides the saved residuals.
        bwd_base: per position, bytes its backward needs besides the saved residuals
            and ``node_bytes`` of what it recomputes.
        loss_base: bytes the loss needs besides the saved residuals.
    """

    graphs: tuple[OptionGraph, ...]
    groups: tuple[int, ...]
    node_bytes: tuple[tuple[int, ...], ...]
    fwd_base: tuple[int, ...]
    bwd_base: tuple[int, ...]
    loss_base: int

    def __post_init__(self) -> None:
        L = len(self.graphs)
        for name in ("groups", "node_bytes", "fwd_base", "bwd_base"):
            if len(getattr(self, name)) != L:
                raise InvalidProblem(
                    f"SaveSetChain.{name} has {len(getattr(self, name))} entries, graphs {L}"
                )
        first: dict[int, int] = {}
        for k, (g, nb) in enumerate(zip(self.graphs, self.node_bytes, strict=True)):
            if len(nb) != len(g.cost):
                raise InvalidProblem(
                    f"SaveSetChain.node_bytes[{k}] has {len(nb)} entries, its graph "
                    f"{len(g.cost)} nodes"
                )
            if any(b < 0 for b in nb):
                raise InvalidProblem(f"SaveSetChain.node_bytes[{k}]: bytes must be >= 0")
            j = first.setdefault(self.groups[k], k)
            if self.graphs[j] != g:
                raise InvalidProblem(
                    f"SaveSetChain.groups: positions {j} and {k} share group "
                    f"{self.groups[k]} but not their graph"
                )

    @property
    def length(self) -> int:
        return len(self.graphs)


def variables(graphs: tuple[OptionGraph, ...], groups: tuple[int, ...]) -> int:
    """Binary variables of the MILP over these positions (one save set per group)."""
    seen: dict[int, int] = {}
    for g, group in zip(graphs, groups, strict=True):
        seen.setdefault(group, len(g.values) + len(g.cost))
    return sum(seen.values())


@dataclass(frozen=True)
class WholeAnswer:
    """An answer of :func:`whole_save_sets`.

    Attributes:
        save_sets: per position, the candidates it saves (reduced to those its
            backward reads).
        recompute_time: the model's objective, seconds.
        optimal: HiGHS proved it optimal (else the time limit stopped it).
        solve_time: seconds in HiGHS.
        variables: binary variables.
    """

    save_sets: tuple[frozenset[int], ...]
    recompute_time: float
    optimal: bool
    solve_time: float
    variables: int


def model_needs(chain: SaveSetChain, save_sets, recompute_sets) -> tuple[list[int], list[int], int]:
    """The model's bytes per step for given sets: (F(k) per k, B(k) per k, loss)."""
    saved = [sum(g.value_sizes[c] for c in s) for g, s in zip(chain.graphs, save_sets, strict=True)]
    prefix = np.cumsum(saved).tolist() if saved else []
    fwd = [chain.fwd_base[k] + prefix[k] for k in range(chain.length)]
    bwd = [
        chain.bwd_base[k] + prefix[k] + sum(chain.node_bytes[k][i] for i in recompute_sets[k])
        for k in range(chain.length)
    ]
    return fwd, bwd, chain.loss_base + (prefix[-1] if prefix else 0)


def whole_save_sets(
    chain: SaveSetChain, budget: int, *, node_limit: int = NODE_LIMIT,
    time_limit: float | None = None,
) -> WholeAnswer:  # fmt: skip
    """Solve the whole-graph MILP (module docstring) with HiGHS, within ``node_limit``
    branch-and-bound nodes (deterministic) and, only if given, ``time_limit`` seconds
    (an answer stopped by the clock depends on the machine's load). ``optimal`` says
    whether HiGHS proved the answer optimal.

    Raises:
        solvers.Infeasible: no save sets fit the model under ``budget`` (no least budget
            is claimed: the model is an estimate), or a limit was reached before any
            answer was found.
    """
    L = chain.length
    col0: dict[int, int] = {}  # group -> first column
    ncols = 0
    for k in range(L):
        if chain.groups[k] not in col0:
            col0[chain.groups[k]] = ncols
            ncols += len(chain.graphs[k].values) + len(chain.graphs[k].cost)
    costs, lower, upper = np.zeros(ncols), np.zeros(ncols), np.ones(ncols)
    saved = np.zeros((L, ncols))  # row k: bytes position k saves
    rec = np.zeros((L, ncols))  # row k: bytes position k's backward holds when recomputing
    blocks, lbs, done = [], [], set()
    for k in range(L):
        g, c0 = chain.graphs[k], col0[chain.groups[k]]
        nv, r = len(g.values), slice(c0 + len(g.values), c0 + len(g.values) + len(g.cost))
        costs[r] += g.cost  # every position recomputes
        saved[k, c0 : c0 + nv] = g.value_sizes
        rec[k, r] = chain.node_bytes[k]
        if chain.groups[k] in done:
            continue  # the group's variables and rows are there already
        done.add(chain.groups[k])
        lower[r] = np.asarray(g.self_recompute, dtype=float)
        A, lb = consistency_rows(g)
        A = A.tocoo()
        blocks.append(sp.csr_matrix((A.data, (A.row, A.col + c0)), shape=(A.shape[0], ncols)))
        lbs.append(lb)
    # memory rows: the saved bytes of positions 0..k (+ what k recomputes), and the loss
    prefix = np.cumsum(saved, axis=0)
    mem = np.vstack([prefix, prefix + rec, prefix[-1:] if L else np.zeros((1, ncols))])
    room = budget - np.asarray([*chain.fwd_base, *chain.bwd_base, chain.loss_base], dtype=float)
    if (room < 0).any():
        raise Infeasible("whole_milp", budget, None, "a step needs more than the budget "
                         "before any residual is saved")  # fmt: skip
    scale = float(costs.sum()) or 1.0
    sizes_row = prefix[-1] if L else np.zeros(ncols)
    c = costs / scale + 1e-6 * sizes_row / (float(sizes_row.sum()) or 1.0)
    constraints = [LinearConstraint(sp.csr_matrix(mem), -np.inf, room)]
    if blocks:
        constraints.append(LinearConstraint(sp.vstack(blocks).tocsr(), np.concatenate(lbs), np.inf))
    if ncols == 0:  # nothing to decide (no block has a value to save or recompute)
        return WholeAnswer(tuple(frozenset() for _ in range(L)), 0.0, True, 0.0, 0)
    start = time.perf_counter()
    res = milp(c, constraints=constraints, integrality=np.ones(ncols), bounds=Bounds(lower, upper),
               options=milp_options(node_limit, time_limit))  # fmt: skip
    solve_time = time.perf_counter() - start
    if res.x is None:
        why = {
            1: f"node limit {node_limit} or time limit {time_limit} s reached without an answer",
            2: "no save sets fit its linear model under the budget",
        }.get(res.status, res.message)
        raise Infeasible("whole_milp", budget, None, why)
    x = res.x > 0.5
    sets = []
    for k in range(L):
        g, c0 = chain.graphs[k], col0[chain.groups[k]]
        sets.append(frozenset(read_values(g, {j for j in range(len(g.values)) if x[c0 + j]})))
    spent = sum(
        sum(g.cost[i] for i in recompute_set(g, s)) for g, s in zip(chain.graphs, sets, strict=True)
    )
    return WholeAnswer(
        save_sets=tuple(sets),
        recompute_time=spent,
        optimal=res.status == 0,
        solve_time=solve_time,
        variables=ncols,
    )
