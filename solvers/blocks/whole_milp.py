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

**Host memory.** With a host link (``host_cost`` not None) each position may also keep
all its saved residuals in host memory from its recording to its backward (the
all-on-host variant of its save set, ``SaveOption.host == "all"``): a binary ``z_k``
and ``w_{k,c} = s_{k,c} z_k`` (linearized: ``w <= s``, ``w <= z``, ``w >= s + z - 1``),
``host_k = sum_c size_c w_{k,c}``. Its residuals then count on the device only while
its own recording and backward run (made there, brought back there), so every other
step's row has ``saved_j - host_j`` for ``j != k``; ``sum_k host_k <= host_memory``
when that is given; the objective adds ``host_cost * host_k`` (the copies out and
back, charged whole: an upper bound, as the block chain charges them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from schedir import InvalidProblem
from solvers._highs import quiet_stdout
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
        host_cost: seconds per byte a position's residuals kept in host memory cost
            (their copies out and back); None: no host link, no such choice.
        host_memory: bytes of host memory (None: unlimited).
    """

    graphs: tuple[OptionGraph, ...]
    groups: tuple[int, ...]
    node_bytes: tuple[tuple[int, ...], ...]
    fwd_base: tuple[int, ...]
    bwd_base: tuple[int, ...]
    loss_base: int
    host_cost: float | None = None
    host_memory: int | None = None

    def __post_init__(self) -> None:
        L = len(self.graphs)
        if self.host_cost is not None and not self.host_cost >= 0:
            raise InvalidProblem(f"SaveSetChain.host_cost = {self.host_cost!r}: expected "
                                 f"seconds per byte >= 0, or None")  # fmt: skip
        if self.host_memory is not None and not self.host_memory >= 0:
            raise InvalidProblem(f"SaveSetChain.host_memory = {self.host_memory!r}: expected "
                                 f"bytes >= 0, or None")  # fmt: skip
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


def variables(graphs: tuple[OptionGraph, ...], groups: tuple[int, ...], host: bool = False) -> int:
    """Binary variables of the MILP over these positions (one save set per group;
    ``host``: with the host-memory choice, ``1 + len(values)`` more per position)."""
    seen: dict[int, int] = {}
    for g, group in zip(graphs, groups, strict=True):
        seen.setdefault(group, len(g.values) + len(g.cost))
    return sum(seen.values()) + (sum(1 + len(g.values) for g in graphs) if host else 0)


@dataclass(frozen=True)
class WholeAnswer:
    """An answer of :func:`whole_save_sets`.

    Attributes:
        save_sets: per position, the candidates it saves (reduced to those its
            backward reads).
        recompute_time: seconds of recomputation of the answer.
        optimal: HiGHS proved it optimal (else the time limit stopped it).
        solve_time: seconds in HiGHS.
        variables: binary variables.
    """

    save_sets: tuple[frozenset[int], ...]
    recompute_time: float
    optimal: bool
    solve_time: float
    variables: int
    on_host: tuple[bool, ...] = ()

    @property
    def host_positions(self) -> tuple[bool, ...]:
        """Per position, whether it keeps its saved residuals in host memory."""
        return self.on_host or (False,) * len(self.save_sets)


def model_needs(
    chain: SaveSetChain, save_sets, recompute_sets, on_host=None
) -> tuple[list[int], list[int], int]:
    """The model's bytes per step for given sets (``on_host``: per position, whether
    its saved residuals are in host memory): (F(k) per k, B(k) per k, loss)."""
    saved = [sum(g.value_sizes[c] for c in s) for g, s in zip(chain.graphs, save_sets, strict=True)]
    host = [n if on_host is not None and on_host[k] else 0 for k, n in enumerate(saved)]
    device = np.cumsum([n - h for n, h in zip(saved, host, strict=True)]).tolist()
    fwd = [chain.fwd_base[k] + device[k] + host[k] for k in range(chain.length)]
    bwd = [
        chain.bwd_base[k] + device[k] + host[k]
        + sum(chain.node_bytes[k][i] for i in recompute_sets[k])
        for k in range(chain.length)
    ]  # fmt: skip
    return fwd, bwd, chain.loss_base + (device[-1] if device else 0)


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
    hosted = chain.host_cost is not None
    host0 = []  # position -> its column z_k, then its w_{k,c}
    for k in range(L) if hosted else ():
        host0.append(ncols)
        ncols += 1 + len(chain.graphs[k].values)
    costs, lower, upper = np.zeros(ncols), np.zeros(ncols), np.ones(ncols)
    saved = np.zeros((L, ncols))  # row k: bytes position k saves
    host = np.zeros((L, ncols))  # row k: bytes position k keeps in host memory
    rec = np.zeros((L, ncols))  # row k: bytes position k's backward holds when recomputing
    blocks, lbs, ubs, done = [], [], [], set()
    for k in range(L):
        g, c0 = chain.graphs[k], col0[chain.groups[k]]
        nv, r = len(g.values), slice(c0 + len(g.values), c0 + len(g.values) + len(g.cost))
        costs[r] += g.cost  # every position recomputes
        saved[k, c0 : c0 + nv] = g.value_sizes
        rec[k, r] = chain.node_bytes[k]
        if hosted:  # w <= s, w <= z, w >= s + z - 1 (w = s z)
            z, w = host0[k], host0[k] + 1
            host[k, w : w + nv] = g.value_sizes
            costs[w : w + nv] += chain.host_cost * np.asarray(g.value_sizes, dtype=float)
            rows = []
            for c in range(nv):
                rows += [({w + c: 1, c0 + c: -1}, -np.inf, 0), ({w + c: 1, z: -1}, -np.inf, 0),
                         ({c0 + c: 1, z: 1, w + c: -1}, -np.inf, 1)]  # fmt: skip
            blocks.append(_rows([a for a, _, _ in rows], ncols))
            lbs.append(np.asarray([lo for _, lo, _ in rows], dtype=float))
            ubs.append(np.asarray([hi for _, _, hi in rows], dtype=float))
        if chain.groups[k] in done:
            continue  # the group's variables and rows are there already
        done.add(chain.groups[k])
        lower[r] = np.asarray(g.self_recompute, dtype=float)
        A, lb = consistency_rows(g)
        A = A.tocoo()
        blocks.append(sp.csr_matrix((A.data, (A.row, A.col + c0)), shape=(A.shape[0], ncols)))
        lbs.append(lb)
        ubs.append(np.full(len(lb), np.inf))
    # memory rows: the device part of positions 0..k's residuals, all of k's (its
    # recording made them, its backward brought them back; + what k recomputes), and
    # the loss; then the host memory
    device = np.cumsum(saved - host, axis=0)
    last = device[-1:] if L else np.zeros((1, ncols))
    mem = np.vstack([device + host, device + host + rec, last])
    room = budget - np.asarray([*chain.fwd_base, *chain.bwd_base, chain.loss_base], dtype=float)
    if (room < 0).any():
        raise Infeasible("whole_milp", budget, None, "a step needs more than the budget "
                         "before any residual is saved")  # fmt: skip
    if hosted and chain.host_memory is not None:
        mem = np.vstack([mem, host.sum(axis=0, keepdims=True)])
        room = np.append(room, float(chain.host_memory))
    scale = float(costs.sum()) or 1.0
    sizes_row = saved.sum(axis=0)
    c = costs / scale + 1e-6 * sizes_row / (float(sizes_row.sum()) or 1.0)
    constraints = [LinearConstraint(sp.csr_matrix(mem), -np.inf, room)]
    if blocks:
        constraints.append(LinearConstraint(sp.vstack(blocks).tocsr(), np.concatenate(lbs),
                                            np.concatenate(ubs)))  # fmt: skip
    if ncols == 0:  # nothing to decide (no block has a value to save or recompute)
        return WholeAnswer(tuple(frozenset() for _ in range(L)), 0.0, True, 0.0, 0)
    start = time.perf_counter()
    bounds, options = Bounds(lower, upper), milp_options(node_limit, time_limit)
    with quiet_stdout():  # scipy's HiGHS may print a debugging line (solvers._highs)
        res = milp(c, constraints=constraints, integrality=np.ones(ncols), bounds=bounds,
                   options=options)  # fmt: skip
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
    on_host = tuple(bool(x[host0[k]]) and bool(sets[k]) for k in range(L)) if hosted else ()
    spent = sum(
        sum(g.cost[i] for i in recompute_set(g, s)) for g, s in zip(chain.graphs, sets, strict=True)
    )
    return WholeAnswer(
        save_sets=tuple(sets),
        recompute_time=spent,
        optimal=res.status == 0,
        solve_time=solve_time,
        variables=ncols,
        on_host=on_host,
    )


def _rows(rows: list[dict[int, float]], ncols: int) -> sp.csr_matrix:
    """Sparse rows from ``{column: coefficient}`` dicts."""
    data = [(i, c, v) for i, row in enumerate(rows) for c, v in row.items()]
    i, c, v = zip(*data, strict=True) if data else ((), (), ())
    return sp.csr_matrix((v, (i, c)), shape=(len(rows), ncols))
