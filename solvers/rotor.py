"""``rotor``: the optimal persistent schedule of a heterogeneous chain (docs/chain_solvers.md).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
heterogeneous chains: how to train deep neural networks with limited memory" (2019).
C(m, i, t) is the least time to run stages i..t from a_i to d_i with m bytes besides
a_i; the optimum for a budget M is C(M - x_0, 0, L).

Implementation. One table answers every budget up to M. Row ``rows[i][t - i]`` holds
C(., i, t) over m = 0..M; column ``cols[t][j]`` holds P_j + C(m - x_j, j, t) (the split
at j, already shifted by x_j and offset by the prefix sum P_j of forward times), so
the best split for (i, t) is one vectorized ``min`` over a contiguous (t - i, M + 1)
block: no Python loop over memory. Time O(L^3 M / 6) element operations, memory two
float64 tables of (L + 1)(L + 2)/2 x (M + 1) entries: 160 MB for L = 200, M = 500;
1.6 GB for L = 200, M = 5000. :func:`table_bytes` tells before building.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from schedir import Chain, Schedule, discretize, simulate_chain
from solvers._chain_tree import Record, Split, tree_ops
from solvers.registry import Infeasible, register
from solvers.store_all import store_all_ops


@dataclass(frozen=True)
class RotorTable:
    """The DP table of a chain for every m in 0..``max_memory``.

    Attributes:
        chain: the chain (sizes in its own units: bytes or slots).
        max_memory: the largest m tabulated (budget minus x_0), same units.
        rows: ``rows[i][t - i, m]`` = C(m, i, t), seconds (inf when infeasible).
        cols: ``cols[t][j, m]`` = P_j + C(m - x_j, j, t), seconds.
        prefix: ``prefix[j]`` = sum of fwd_time[0..j-1], seconds.
    """

    chain: Chain
    max_memory: int
    rows: tuple
    cols: tuple
    prefix: np.ndarray
    tight: bool = False

    def _record(self, i: int, t: int, m: int) -> float:
        """Time of recording stage i first, for (m, i, t) (same arithmetic as the table)."""
        s = self.chain.saved_size[i]
        if m < s or (self.tight and m < _forward_need(self.chain, i, t)):
            return math.inf
        base = self.rows[i][0, m] if not self.tight else _bare_base(self.chain, i, m)
        return base + self.rows[i + 1][t - i - 1, m - s]

    def value(self, budget: int) -> float:
        """Optimal makespan at ``budget`` (including x_0), seconds; inf if infeasible."""
        m = budget - self.chain.in_size[0]
        if m < 0:
            return math.inf
        return float(self.rows[0][self.chain.length, min(m, self.max_memory)])

    def choose(self, i: int, t: int, m: int):
        """The move of an optimal schedule for (m, i, t): None (record) or a split."""
        row, s = self.rows[i], self.chain.saved_size[i]
        record = self._record(i, t, m)
        splits = self.cols[t][i + 1 : t + 1, m] + row[0 : t - i, m]
        k = int(np.argmin(splits))
        if record <= splits[k] - self.prefix[i]:
            return Record(m - s)
        j = i + 1 + k
        return Split(j, m - self.chain.in_size[j], m)

    def ops(self, budget: int) -> tuple:
        """Ops of an optimal schedule at ``budget`` (which must be feasible)."""
        m = min(budget - self.chain.in_size[0], self.max_memory)
        if not math.isfinite(self.value(budget)):
            raise ValueError(f"budget {budget} is infeasible for this table")
        return tree_ops(self.chain.length, self.choose, m)


def table_bytes(chain: Chain, max_memory: int) -> int:
    """Bytes the two float64 tables take for m = 0..max_memory."""
    n = chain.length + 1
    return 2 * 8 * (n * (n + 1) // 2) * (max_memory + 1)


def _backward_need(chain: Chain, i: int) -> int:
    """Memory besides a_i during B(i): d_i, d_{i+1}, abar_{i+1} and bwd_tmp."""
    x = chain.in_size + (0,)
    return x[i] + x[i + 1] + chain.saved_size[i] + chain.bwd_tmp[i]


def _forward_need(chain: Chain, i: int, t: int) -> int:
    """Memory besides a_i during F_all(i) when solving i..t: d_{t+1}, abar_{i+1}, fwd_tmp."""
    return (chain.in_size + (0,))[t + 1] + chain.saved_size[i] + chain.fwd_tmp[i]


def _bare_base(chain: Chain, i: int, m: int) -> float:
    """fwd + bwd time of stage i if B(i) fits in m, else inf (tight model's record)."""
    return chain.fwd_time[i] + chain.bwd_time[i] if m >= _backward_need(chain, i) else math.inf


def build_table(chain: Chain, budget: int, *, tight: bool = False) -> RotorTable:
    """The DP table for every budget up to ``budget`` (sizes in the chain's units).

    ``tight=False`` is rotor's published recursion (docs/chain_solvers.md). ``tight=True`` charges
    F_all(i) what it really holds when stages i..t are solved (d_{t+1}, not d_{i+1}):
    exact for the simulator's semantics (see docs/semantics.md).
    """
    L = chain.length
    a = chain.arrays()
    x, s, ftmp, btmp = a["in_size"], a["saved_size"], a["fwd_tmp"], a["bwd_tmp"]
    fwd, bwd = a["fwd_time"], a["bwd_time"]
    M = int(budget - x[0])
    if M < 0:
        raise ValueError(f"budget {budget} < x_0 = {x[0]}")
    prefix = np.concatenate([[0.0], np.cumsum(fwd)])
    width = M + 1
    rows: list = [None] * (L + 1)
    cols = [np.full((t + 1, width), np.inf) for t in range(L + 1)]
    pair = x[:-1] + x[1:] + ftmp  # pair[j] = x_j + x_{j+1} + fwd_tmp[j]
    scratch = np.empty((L + 1, width))
    for i in range(L, -1, -1):
        row = np.full((L + 1 - i, width), np.inf)
        base_need = max(x[i + 1] + s[i] + ftmp[i], x[i] + x[i + 1] + s[i] + btmp[i])
        row[0, min(base_need, width) :] = fwd[i] + bwd[i]
        bare = np.full(width, np.inf)  # tight model: fwd + bwd wherever B(i) fits
        if tight:
            bare[min(_backward_need(chain, i), width) :] = fwd[i] + bwd[i]
        si = int(s[i])
        inner_pair = -1  # max of pair[j] over i < j < t; sizes are >= 0
        for t in range(i + 1, L + 1):
            n = t - i
            if t - 1 > i:
                inner_pair = max(inner_pair, int(pair[t - 1]))
            out = row[n]
            if si < width:  # record stage i: C(m, i, i) + C(m - s_i, i + 1, t)
                first = bare if tight else row[0]
                np.add(first[si:], rows[i + 1][n - 1, : width - si], out=out[si:])
                if tight:
                    out[: min(_forward_need(chain, i, t), width)] = np.inf
            # split at j = i+1..t: P_j + C(m - x_j, j, t) + C(m, i, j - 1) - P_i
            block = scratch[:n]
            np.add(cols[t][i + 1 : t + 1], row[0:n], out=block)
            best_split = block.min(axis=0)
            best_split -= prefix[i]
            np.minimum(out, best_split, out=out)
            threshold = x[t + 1] + max(x[i + 1] + ftmp[i], inner_pair)
            out[: min(threshold, width)] = np.inf
        rows[i] = row
        if i >= 1 and x[i] <= M:
            for t in range(i, L + 1):
                cols[t][i, x[i] :] = prefix[i] + row[t - i, : width - x[i]]
    return RotorTable(chain, M, tuple(rows), tuple(cols), prefix, tight)


def _least_memory(chain: Chain, tight: bool) -> tuple[list, list]:
    """need[i][t - i]: least m with C(m, i, t) < inf; shifted[t][j] = x_j + need(j, t).

    The same recursion as the DP with (max, min) in place of (+, min): exact in
    integers, O(L^3) with numpy over the split point.
    """
    L = chain.length
    a = chain.arrays()
    x, s, ftmp, btmp = a["in_size"], a["saved_size"], a["fwd_tmp"], a["bwd_tmp"]
    pair = x[:-1] + x[1:] + ftmp
    need = [None] * (L + 1)  # need[i][t - i]: least m for C(m, i, t) < inf
    shifted = [np.zeros(t + 1, dtype=np.int64) for t in range(L + 1)]  # x_j + need(j, t)
    for i in range(L, -1, -1):
        row = np.zeros(L + 1 - i, dtype=np.int64)
        row[0] = max(x[i + 1] + s[i] + ftmp[i], x[i] + x[i + 1] + s[i] + btmp[i])
        inner_pair = -1
        for t in range(i + 1, L + 1):
            if t - 1 > i:
                inner_pair = max(inner_pair, int(pair[t - 1]))
            if tight:
                first = max(_backward_need(chain, i), _forward_need(chain, i, t))
            else:
                first = row[0]
            record = max(first, s[i] + need[i + 1][t - i - 1])
            split = np.maximum(shifted[t][i + 1 : t + 1], row[0 : t - i]).min()
            threshold = x[t + 1] + max(x[i + 1] + ftmp[i], inner_pair)
            row[t - i] = max(threshold, min(record, split))
        need[i] = row
        for t in range(i, L + 1):
            shifted[t][i] = x[i] + row[t - i]
    return need, shifted


def _first_need(chain: Chain, i: int, t: int, tight: bool) -> int:
    """Memory besides a_i that recording stage i first needs (its own part)."""
    if tight:
        return max(_backward_need(chain, i), _forward_need(chain, i, t))
    x = chain.in_size + (0,)
    s, ftmp = chain.saved_size[i], chain.fwd_tmp[i]
    return max(x[i + 1] + s + ftmp, _backward_need(chain, i))


def min_memory(chain: Chain, *, tight: bool = False) -> int:
    """The least budget (including x_0) at which the DP (of that model) finds a schedule."""
    need, _ = _least_memory(chain, tight)
    return int(chain.in_size[0] + need[0][chain.length])


def min_memory_ops(chain: Chain, budget: int, *, tight: bool = False) -> tuple:
    """A schedule that fits ``budget`` whenever ``budget >= min_memory(chain)``.

    Exact in bytes at any size (no table over memory): records when it fits, else
    splits at the farthest feasible point. Used when a discretized solve finds
    nothing although the byte budget is feasible.
    """
    need, shifted = _least_memory(chain, tight)
    s = chain.saved_size

    def choose(i: int, t: int, m: int):
        if m >= max(_first_need(chain, i, t, tight), s[i] + need[i + 1][t - i - 1]):
            return Record(m - s[i])
        feasible = np.maximum(shifted[t][i + 1 : t + 1], need[i][0 : t - i]) <= m
        j = i + 1 + int(np.flatnonzero(feasible)[-1])
        return Split(j, m - chain.in_size[j], m)

    m = budget - chain.in_size[0]
    if m < need[0][chain.length]:
        raise ValueError(f"budget {budget} < min_memory {min_memory(chain, tight=tight)}")
    return tree_ops(chain.length, choose, m)


def no_recompute_budget(chain: Chain, *, tight: bool = False) -> int:
    """The least budget at which the DP finds the no-recomputation (store-all) time.

    Beyond it C is constant, so tables never need to be larger. It can exceed the
    simulated peak of ``store_all``: rotor's base case charges d_{i+1} during F_all(i)
    although d_{i+1} is not resident yet (see docs/semantics.md).
    """
    L = chain.length
    x, s = chain.in_size + (0,), chain.saved_size
    ftmp, btmp = chain.fwd_tmp, chain.bwd_tmp

    def base(i: int) -> int:
        return max(x[i + 1] + s[i] + ftmp[i], x[i] + x[i + 1] + s[i] + btmp[i])

    need = base(L)
    inner_pair = -1  # max of x_j + x_{j+1} + fwd_tmp[j] over i < j < L
    for i in range(L - 1, -1, -1):
        if i + 1 < L:
            inner_pair = max(inner_pair, x[i + 1] + x[i + 2] + ftmp[i + 1])
        threshold = x[L + 1] + max(x[i + 1] + ftmp[i], inner_pair)
        first = max(_backward_need(chain, i), _forward_need(chain, i, L)) if tight else base(i)
        need = max(threshold, first, s[i] + need)
    return x[0] + need


def _solve(chain, budget, tight, max_slots, slots, lower_bound) -> tuple[tuple, dict]:
    """Ops and metadata of the DP of one model; raises Infeasible."""
    least = min_memory(chain, tight=tight)
    if budget < least:
        raise Infeasible("rotor", budget, least)
    capped = min(budget, no_recompute_budget(chain, tight=tight))
    if capped <= max_slots:
        table = build_table(chain, capped, tight=tight)
        return table.ops(capped), {"exact": True, "dp_value": table.value(capped)}
    store_all = store_all_ops(chain)
    if simulate_chain(chain, store_all).peak_memory <= budget:  # no recompute: optimal
        return store_all, {"exact": True, "dp_value": chain.store_all_time()}
    grid = slots
    while True:
        slot = discretize(chain, capped, grid)
        if min_memory(slot.chain, tight=tight) <= slot.budget:
            break
        if grid >= max_slots:  # rounding up lost too much: fall back to a least-memory tree
            ops = min_memory_ops(chain, budget, tight=tight)
            return ops, {"exact": False, "dp_value": None, "fallback": "min_memory", "slots": grid}
        grid = min(2 * grid, max_slots)
    table = build_table(slot.chain, slot.budget, tight=tight)
    info = {"slot_size": slot.slot_size, "slots": grid, "makespan": table.value(slot.budget)}
    if lower_bound:  # sizes rounded down, budget up: a relaxation, so a lower bound
        relaxed = discretize(chain, capped, grid, round_up=False)
        bound = build_table(relaxed.chain, relaxed.budget, tight=tight).value(relaxed.budget)
        info["lower_bound"] = bound
        info["relative_loss"] = (info["makespan"] - bound) / bound if bound > 0 else 0.0
    meta = {"exact": False, "dp_value": info["makespan"], "discretization": info}
    return table.ops(slot.budget), meta


MODELS = ("published", "tight")


@register(
    "rotor",
    problem=Chain,
    exact=True,
    description="optimal persistent schedule: rotor's dynamic program (Beaumont et al. 2019)",
)
def rotor(
    chain: Chain,
    budget: int,
    *,
    model: str = "published",
    max_slots: int = 10_000,
    slots: int = 500,
    lower_bound: bool = True,
) -> Schedule:
    """Optimal persistent schedule of ``chain`` under ``budget``.

    ``model="published"`` runs rotor's recursion as published (docs/chain_solvers.md), so values
    and infeasibility match rotor's. That recursion charges F_all(i) with d_{i+1}
    instead of the d_{t+1} really resident: in rare chains (large ``fwd_tmp``) its
    schedule exceeds the budget in simulation; then the ``"tight"`` model's schedule
    is returned instead and ``meta["published_value"]`` keeps rotor's number.
    ``model="tight"`` is the exact optimum over persistent schedules for the
    simulator's semantics (checked against brute force).

    Exact on the sizes as given while ``min(budget, no-recompute budget) <= max_slots``.
    Beyond that, sizes are discretized to ``slots`` slots (rounded up: the schedule
    is feasible in bytes); ``meta["discretization"]`` then reports the slot size, the
    makespan found and a lower bound on the byte optimum (the DP on sizes rounded
    down), i.e. the discretization loss. If the rounded-up instance is infeasible
    although the byte budget is not, the grid is refined (x2) up to ``max_slots``.
    """
    if model not in MODELS:
        raise ValueError(f"rotor: model = {model!r}, expected one of {', '.join(MODELS)}")
    args = (max_slots, slots, lower_bound)
    ops, meta = _solve(chain, budget, model == "tight", *args)
    meta["model"] = model
    if model == "published" and simulate_chain(chain, ops).peak_memory > budget:
        published = meta["dp_value"]
        ops, meta = _solve(chain, budget, True, *args)
        meta.update(model="tight", published_value=published)
        meta["note"] = "rotor's published recursion under-counts F_all memory on this chain"
    return Schedule(ops, meta)
