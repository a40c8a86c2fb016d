"""The table of rotor's dynamic program, in two models (docs/chain_solvers.md).

C(m, i, t) is the least time to run stages i..t from the input of stage i (resident,
not counted) to d_i, with d_{t+1} resident and m bytes (or slots) besides that input.

- ``tight=True`` (the library's semantics, docs/semantics.md): every move is charged
  exactly what its ops hold in the simulator, so C is the optimum over persistent
  schedules (checked against exhaustive search, ``tests/brute_force.py``), for any
  non-negative sizes: also when abar[k+1] is smaller than a[k+1] (s_k < x_{k+1}), where
  a split's segment may start with ``F_all`` (``_chain_tree.record_first``).
- ``tight=False``: rotor's recursion as published (Beaumont et al. 2019), for
  reproducing rotor's numbers; wrong in both directions on some chains.

One table answers every budget up to M. Row ``rows[i][t - i]`` holds C(., i, t) over
m = 0..M; column ``cols[t][j]`` holds P_j + C(m - x_j, j, t) (the split at j, shifted by
x_j and offset by the prefix sum P_j of forward times), so the best split for (i, t)
is one vectorized pass over a contiguous (t - i, M + 1) block: no Python loop over
memory. Time O(L^3 M / 6) element operations; memory :func:`table_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from schedir import Chain
from solvers.chain._tree import Record, Split, record_first, tree_ops

FLOAT_BYTES = 8


class Needs:
    """Memory each move needs besides its sub-chain's input, per model (exact integers).

    ``leaf(i)``: C(., i, i); ``record(i, t)``: recording stage i's own ops (its child
    adds s_i + need(i+1, t)); ``inner(i)[k] + x_{t+1}``: the forward segment of a split
    at j = i + 1 + k (its children add x_j + need(j, t) and need(i, j-1));
    ``threshold(i, t)``: rotor's bound on every move (published model, and the tight
    model where it is implied). The segment and bound tables are (L+1) x (L+1) ints.
    """

    def __init__(self, chain: Chain, tight: bool):
        self.chain, self.tight = chain, tight
        L = chain.length
        self.x = x = chain.in_size + (0,)
        s, ftmp, btmp = chain.saved_size, chain.fwd_tmp, chain.bwd_tmp
        self.pair = np.asarray([x[k] + x[k + 1] + ftmp[k] for k in range(L + 1)], dtype=np.int64)
        self.base = [max(x[i + 1] + s[i] + ftmp[i], x[i] + x[i + 1] + s[i] + btmp[i])
                     for i in range(L + 1)]  # fmt: skip
        if tight:  # the loss holds d_L and its temporary (the simulator's Loss)
            self.base[L] = x[L] + btmp[L]
        self._inner: np.ndarray | None = None
        self._bound: np.ndarray | None = None
        # Where every abar holds its a (s_k >= x_{k+1}), rotor's bound on (i, t) is
        # implied by the moves' own needs (docs/chain_solvers.md): DPs apply it to (i, t)
        # as a whole; elsewhere (tight model) each split is masked by its own segment.
        self.masked = tight and any(s[k] < x[k + 1] for k in range(L))

    def leaf(self, i: int) -> int:
        return self.base[i]

    def backward(self, i: int) -> int:
        """B(i), i < L: d_i, d_{i+1}, abar_{i+1} and the temporary."""
        c, x = self.chain, self.x
        return x[i] + x[i + 1] + c.saved_size[i] + c.bwd_tmp[i]

    def record(self, i: int, t: int) -> int:
        """Tight: F_all(i) with d_{t+1} resident, and B(i). Published: the base case
        C(m, i, i), which charges d_{i+1} during F_all(i)."""
        c = self.chain
        if not self.tight:
            return self.base[i]
        return max(self.x[t + 1] + c.saved_size[i] + c.fwd_tmp[i], self.backward(i))

    def _hankel(self) -> np.ndarray:
        """``h[i, q] = pair[i + q]`` (0 past the end), a read-only view."""
        n = len(self.pair)
        padded = np.concatenate([self.pair, np.zeros(n + 2, dtype=np.int64)])
        return as_strided(padded, shape=(n, n), strides=(8, 8), writeable=False)

    @property
    def inner_matrix(self) -> np.ndarray:
        """``[i, k]``: the segment of a split of i at i + 1 + k, without d_{t+1}: F_ck(i)
        for k = 0; for k >= 1 F_all(i) first if abar_{i+1} is smaller (tight model)."""
        if self._inner is None:
            c = self.chain
            n = c.length + 1
            x = np.asarray(self.x + (0,), dtype=np.int64)
            ftmp = np.asarray(c.fwd_tmp + (0,), dtype=np.int64)
            saved = np.asarray(c.saved_size, dtype=np.int64)
            y = np.minimum(x[1 : n + 1], saved) if self.tight else x[1 : n + 1]
            head = np.maximum(y + ftmp[:n], y + x[2 : n + 2] + ftmp[1 : n + 1])
            inner = np.empty((n, n), dtype=np.int64)
            inner[:, 0] = x[1 : n + 1] + ftmp[:n]
            if n > 1:
                inner[:, 1] = head
                running = np.maximum.accumulate(self._hankel()[:, 2:n], axis=1)
                np.maximum(head[:, None], running, out=inner[:, 2:n])
            self._inner = inner
        return self._inner

    def inner(self, i: int) -> np.ndarray:
        return self.inner_matrix[i]

    @property
    def bound_matrix(self) -> np.ndarray:
        """``[i, n]``: rotor's bound on (i, i + n) without d_{t+1}: x_{i+1} + fwd_tmp_i
        and every x_k + x_{k+1} + fwd_tmp_k for i < k < i + n."""
        if self._bound is None:
            c = self.chain
            n = c.length + 1
            first = np.asarray([self.x[i + 1] + c.fwd_tmp[i] for i in range(n)], dtype=np.int64)
            bound = np.empty((n, n), dtype=np.int64)
            bound[:, 0] = first
            if n > 1:
                running = np.maximum.accumulate(self._hankel()[:, 1 : n - 1], axis=1)
                bound[:, 1] = first
                np.maximum(first[:, None], running, out=bound[:, 2:n])
            self._bound = bound
        return self._bound

    def threshold(self, i: int, t: int) -> int:
        """Rotor's bound on every move of (i, t)."""
        return self.x[t + 1] + int(self.bound_matrix[i, t - i])


def table_bytes(chain: Chain, max_memory: int) -> int:
    """Bytes of the two float64 tables for m = 0..max_memory (plus one scratch block),
    and of the (L+1) x (L+1) integer tables of needs."""
    n = chain.length + 1
    return FLOAT_BYTES * ((n * (n + 1) + n) * (max_memory + 1) + 3 * n * n)


@dataclass(frozen=True)
class RotorTable:
    """The DP table of a chain for every m in 0..``max_memory``.

    Attributes:
        chain: the chain (sizes in its own units: bytes or slots).
        max_memory: the largest m tabulated (budget minus x_0), same units.
        rows: ``rows[i][t - i, m]`` = C(m, i, t), seconds (inf when infeasible).
        cols: ``cols[t][j, m]`` = P_j + C(m - x_j, j, t), seconds.
        prefix: ``prefix[j]`` = sum of fwd_time[0..j-1], seconds.
        tight: the model (see module doc).
    """

    chain: Chain
    max_memory: int
    rows: tuple
    cols: tuple
    prefix: np.ndarray
    tight: bool
    needs: Needs

    def value(self, budget: int) -> float:
        """Optimal makespan at ``budget`` (including x_0), seconds; inf if infeasible."""
        m = budget - self.chain.in_size[0]
        if m < 0:
            return math.inf
        return float(self.rows[0][self.chain.length, min(m, self.max_memory)])

    def _record(self, i: int, t: int, m: int) -> float:
        """Time of recording stage i first (the same arithmetic as the table)."""
        s = self.chain.saved_size[i]
        if m < s or m < self.needs.record(i, t):
            return math.inf
        c = self.chain
        base = c.fwd_time[i] + c.bwd_time[i] if self.tight else self.rows[i][0, m]
        return base + self.rows[i + 1][t - i - 1, m - s]

    def choose(self, i: int, t: int, m: int):
        """The move of an optimal schedule for (m, i, t)."""
        splits = self.cols[t][i + 1 : t + 1, m] + self.rows[i][0 : t - i, m]
        if self.tight:
            segment = self.needs.x[t + 1] + self.needs.inner(i)[: t - i]
            splits[segment > m] = np.inf
        k = int(np.argmin(splits))
        if self._record(i, t, m) <= splits[k] - self.prefix[i]:
            return Record(m - self.chain.saved_size[i])
        j = i + 1 + k
        first_all = self.tight and record_first(self.chain, i, j)
        return Split(j, m - self.chain.in_size[j], m, first_all)

    def ops(self, budget: int) -> tuple:
        """Ops of an optimal schedule at ``budget`` (which must be feasible)."""
        m = min(budget - self.chain.in_size[0], self.max_memory)
        if not math.isfinite(self.value(budget)):
            raise ValueError(f"budget {budget} is infeasible for this table")
        return tree_ops(self.chain.length, self.choose, m)


def build_table(chain: Chain, budget: int, *, tight: bool = True, progress=None) -> RotorTable:
    """The DP table for every budget up to ``budget`` (sizes in the chain's units).

    ``progress(fraction, message)``, if given, is called after each row of the table.
    """
    L = chain.length
    a = chain.arrays()
    x, s = a["in_size"], a["saved_size"]
    fwd, bwd = a["fwd_time"], a["bwd_time"]
    M = int(budget - x[0])
    if M < 0:
        raise ValueError(f"budget {budget} < x_0 = {x[0]}")
    needs = Needs(chain, tight)
    prefix = np.concatenate([[0.0], np.cumsum(fwd)])
    width = M + 1
    rows: list = [None] * (L + 1)
    cols = [np.full((t + 1, width), np.inf) for t in range(L + 1)]
    scratch = np.empty((L + 1, width))
    columns = np.arange(width)
    total_work, done = (L + 1) * (L + 2) * (L + 3) // 6, 0
    masked = needs.masked  # else one plain min over the splits, then rotor's bound
    for i in range(L, -1, -1):
        row = np.full((L + 1 - i, width), np.inf)
        row[0, min(needs.leaf(i), width) :] = fwd[i] + bwd[i]
        first = row[0]
        if tight and i < L:  # fwd + bwd wherever B(i) fits; F_all(i) is checked per t
            first = np.full(width, np.inf)
            first[min(needs.backward(i), width) :] = fwd[i] + bwd[i]
        si = int(s[i])
        inner = needs.inner(i) if masked else None
        for t in range(i + 1, L + 1):
            n = t - i
            out = row[n]
            if si < width:  # record stage i: its own ops, then C(m - s_i, i + 1, t)
                np.add(first[si:], rows[i + 1][n - 1, : width - si], out=out[si:])
                if tight:
                    out[: min(needs.record(i, t), width)] = np.inf
            # split at j = i+1..t: P_j + C(m - x_j, j, t) + C(m, i, j - 1) - P_i
            block = scratch[:n]
            np.add(cols[t][i + 1 : t + 1], row[0:n], out=block)
            if masked:
                best = _best_split(block, int(x[t + 1]) + inner[:n], columns)
            else:
                best = block.min(axis=0)
            best -= prefix[i]
            np.minimum(out, best, out=out)
            if not masked:
                out[: min(needs.threshold(i, t), width)] = np.inf
        rows[i] = row
        if i >= 1 and x[i] <= M:
            for t in range(i, L + 1):
                cols[t][i, x[i] :] = prefix[i] + row[t - i, : width - x[i]]
        done += (L + 1 - i) * (L + 2 - i) // 2
        if progress is not None:
            progress(done / total_work, f"DP table, {L + 1 - i} of {L + 1} rows, M = {M}")
    return RotorTable(chain, M, tuple(rows), tuple(cols), prefix, tight, needs)


def _best_split(block: np.ndarray, segment: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """min over k of block[k, m] among the splits whose segment fits m (tight model).

    ``segment[k]`` is the need of the split at i + 1 + k. Row 0 is masked in place;
    above the largest segment every row counts (a plain min), below it a masked min.
    """
    width = block.shape[1]
    block[0, : min(int(segment[0]), width)] = np.inf
    hi = min(int(segment[1:].max(initial=0)), width)
    best = np.empty(width)
    if hi < width:
        block[:, hi:].min(axis=0, out=best[hi:])
    if hi > 0:
        fits = columns[None, :hi] >= segment[:, None]
        fits[0] = True
        np.where(fits, block[:, :hi], np.inf).min(axis=0, out=best[:hi])
    return best


def least_memory(chain: Chain, tight: bool) -> tuple[np.ndarray, Needs]:
    """``need[i, t]`` (t >= i): the least m with C(m, i, t) < inf, and the model's Needs.

    The same recursion as the table with (max, min) in place of (+, min), exact in
    integers. Sub-chains of one length n are done at once: their splits are strided
    views of ``need`` (need(i, i+k) and need(i+1+k, i+n) for every i and k), so O(L)
    numpy calls for O(L^3 / 6) element operations (and 2 (L+1)^2 integers).
    """
    L = chain.length
    size = L + 1
    needs = Needs(chain, tight)
    arrays = chain.arrays()
    x, s = arrays["in_size"], arrays["saved_size"]
    ftmp, btmp = arrays["fwd_tmp"], arrays["bwd_tmp"]
    need = np.zeros((size, size), dtype=np.int64)
    by_end = np.zeros((size, size), dtype=np.int64)  # its transpose, for contiguous reads
    row, col = need.strides
    need[np.arange(size), np.arange(size)] = needs.base
    by_end[np.arange(size), np.arange(size)] = needs.base
    base = np.asarray(needs.base, dtype=np.int64)
    for n in range(1, size):
        m = size - n  # sub-chains (i, i + n), i = 0..m-1
        ends = x[n + 1 : n + 1 + m]  # x_{t+1}
        left = as_strided(need, shape=(m, n), strides=(row + col, col))  # need(i, i+k)
        right = as_strided(by_end[n:, 1:], shape=(m, n), strides=(row + col, col))
        inputs = as_strided(x[1:], shape=(m, n), strides=(8, 8))  # x_{i+1+k}
        split = right + inputs
        np.maximum(split, left, out=split)
        if needs.masked:
            np.maximum(split, ends[:, None] + needs.inner_matrix[:m, :n], out=split)
        child = as_strided(need[1:, n:], shape=(m,), strides=(row + col,))  # need(i+1, t)
        if tight:
            backward = x[:m] + x[1 : m + 1] + s[:m] + btmp[:m]
            own = np.maximum(ends + s[:m] + ftmp[:m], backward)
        else:
            own = base[:m]
        value = np.minimum(np.maximum(own, s[:m] + child), split.min(axis=1))
        if not needs.masked:
            np.maximum(value, ends + needs.bound_matrix[:m, n], out=value)
        as_strided(need[:, n:], shape=(m,), strides=(row + col,))[:] = value
        as_strided(by_end[n:, :], shape=(m,), strides=(row + col,))[:] = value
    return need, needs


def min_memory(chain: Chain, *, tight: bool = True) -> int:
    """The least budget (including x_0) at which the DP (of that model) finds a schedule."""
    need, _ = least_memory(chain, tight)
    return int(chain.in_size[0] + need[0, chain.length])


def min_memory_ops(chain: Chain, budget: int, *, tight: bool = True) -> tuple:
    """A schedule that fits ``budget`` whenever ``budget >= min_memory(chain)``.

    Exact in bytes at any size (no table over memory): records when it fits, else
    splits at the farthest feasible point. Used when a discretized solve finds
    nothing although the byte budget is feasible.
    """
    need, needs = least_memory(chain, tight)
    s, x = chain.saved_size, needs.x
    xs = np.asarray(x, dtype=np.int64)

    def choose(i: int, t: int, m: int):
        if m >= max(needs.record(i, t), s[i] + int(need[i + 1, t])):
            return Record(m - s[i])
        j = i + 1 + int(np.flatnonzero(_split_needs(need, needs, xs, i, t) <= m)[-1])
        return Split(j, m - x[j], m, tight and record_first(chain, i, j))

    m = budget - chain.in_size[0]
    if m < need[0, chain.length]:
        raise ValueError(f"budget {budget} < min_memory {min_memory(chain, tight=tight)}")
    return tree_ops(chain.length, choose, m)


def _split_needs(need: np.ndarray, needs: Needs, xs: np.ndarray, i: int, t: int) -> np.ndarray:
    """Least memory of the split of (i, t) at each j = i+1..t."""
    fits = np.maximum(xs[i + 1 : t + 1] + need[i + 1 : t + 1, t], need[i, i:t])
    if needs.tight:
        fits = np.maximum(fits, xs[t + 1] + needs.inner(i)[: t - i])
    return fits


def no_recompute_budget(chain: Chain, *, tight: bool = True) -> int:
    """The least budget from which the DP's value is the no-recomputation time.

    Tight model: the store-all schedule's simulated peak (recording every stage is
    feasible there, and nothing is faster). Published model: the least budget at
    which rotor's recursion records every stage (it charges d_{i+1} during F_all(i),
    so this may exceed the store-all peak).
    """
    L = chain.length
    needs = Needs(chain, tight)
    need = needs.leaf(L)
    for i in range(L - 1, -1, -1):
        own = needs.record(i, L)
        if not tight:
            own = max(own, needs.threshold(i, L))
        need = max(own, chain.saved_size[i] + need)
    return chain.in_size[0] + need


def guided_ops(chain: Chain, guide: RotorTable, slot: int, budget: int) -> tuple:
    """A schedule that fits ``budget`` bytes (>= the model's least budget), steered by
    ``guide``, the table of the relaxation (sizes rounded down to ``slot`` bytes).

    At each sub-chain, among the moves whose exact byte needs fit (from
    :func:`least_memory`, so the result always fits), the one whose time plus the
    guide's values of its children is least. Used where rounding sizes up leaves no
    schedule, and as a competitor of the rounded-up table's schedule.
    """
    tight = guide.tight
    need, needs = least_memory(chain, tight)
    x, s = needs.x, chain.saved_size
    xs = np.asarray(x, dtype=np.int64)
    rows, top = guide.rows, guide.max_memory
    prefix = guide.prefix

    def estimate(i: int, t: int, m: int) -> float:
        return float(rows[i][t - i, min(-(-m // slot), top)])

    def choose(i: int, t: int, m: int):
        best, move = math.inf, None
        if m >= max(needs.record(i, t), s[i] + int(need[i + 1, t])):
            best = chain.fwd_time[i] + chain.bwd_time[i] + estimate(i + 1, t, m - s[i])
            move = Record(m - s[i])
        for k in np.flatnonzero(_split_needs(need, needs, xs, i, t) <= m).tolist():
            j = i + 1 + k
            value = prefix[j] - prefix[i] + estimate(j, t, m - x[j]) + estimate(i, j - 1, m)
            if value < best or move is None:
                best = value
                move = Split(j, m - x[j], m, tight and record_first(chain, i, j))
        return move

    m = budget - chain.in_size[0]
    if m < need[0, chain.length]:
        raise ValueError(f"budget {budget} < min_memory {min_memory(chain, tight=tight)}")
    return tree_ops(chain.length, choose, m)
