"""``block_rotor``: rotor's recursion over a block chain with save options (docs/auto.md).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
heterogeneous chains" (2019), with each stage's recording move choosing one of its
save options, as Rockmate does (Zhao et al., "Rockmate: an efficient, fast,
automatic and generic tool for re-materialization in PyTorch", ICML 2023). The
recursion is the library's tight model (docs/semantics.md) on the
:class:`schedir.blocks.BlockChain` semantics: sizes are relative to the sub-problem's
input, so a value held by several cuts (a skip connection) is paid once.

C(m, i, t): least time to run stages i..t (t = L: with the loss) from a_i to d_i,
with a_i resident and not counted, d_{t+1} resident and counted in m. With
``x(i, j)`` = bytes of a_j not in a_i, ``s(i, o)`` = x(i, i+1) + option o's saved
bytes, ``g(c)`` = bytes of d[c] and ``gnew(c)`` = bytes of d[c] not in d[c+1]:

- loss: C(m, L, L) = loss_time if m >= g(L) + loss_tmp;
- record stage i with option o (``F_all(i)``, stages i+1..t, ``B(i)``): rec_time +
  bwd_time + C(m - s(i, o), i+1, t) (0 when i = t) if m >= g(t+1) + s(i, o) + rec_tmp
  and m >= s(i, o) + g(i+1) + gnew(i) + bwd_tmp - bwd_release;
- split at i < j <= t (``F_ck(i) F_n(i+1..j-1)``, stages j..t, then i..j-1): the
  forward times + C(m - x(i, j), j, t) + C(m, i, j-1) if m >= g(t+1) + x(i, i+1) +
  fwd_tmp[i] and m >= g(t+1) + bytes(a_l and a_{l+1} not in a_i) + fwd_tmp[l] for
  i < l < j.

Exact over persistent schedules for the block chain's simulator on the sizes as given
(checked against brute force), while the budget (capped where nothing is recomputed)
is at most ``max_slots`` bytes; beyond, sizes are rounded up to ``slots`` slots (the
schedule then fits in bytes) and ``meta["discretization"]`` reports the grid.
"""

from __future__ import annotations

import math

import numpy as np

from schedir import B, F_all, F_ck, F_n, Loss
from schedir.blocks.problem import BlockChain
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import simulate_blocks
from solvers.registry import Infeasible, register


class _Sizes:
    """The recursion's sizes, in bytes, for one block chain."""

    def __init__(self, p: BlockChain) -> None:
        L = p.length
        self.L = L
        vs = p.value_sizes
        cuts = [frozenset(c) for c in p.cuts]
        self.x0 = sum(vs[v] for v in cuts[0])
        self.x = [[0] * (L + 1) for _ in range(L + 1)]  # x[i][j] = bytes(a_j - a_i)
        self.pair = [[0] * (L + 1) for _ in range(L + 1)]  # a_l | a_{l+1} minus a_i
        for i in range(L + 1):
            for j in range(i, L + 1):
                self.x[i][j] = sum(vs[v] for v in cuts[j] - cuts[i])
            for l in range(i + 1, L):
                self.pair[i][l] = sum(vs[v] for v in (cuts[l] | cuts[l + 1]) - cuts[i])
        grads = [p.grad_ids(c) for c in range(L + 1)]
        gs = p.grad_sizes
        self.g = [sum(gs[v] for v, _ in d) for d in grads] + [0]
        self.gnew = [sum(gs[v] for v, _ in grads[c] - grads[c + 1]) for c in range(L)]
        self.ftmp = [s.fwd_tmp for s in p.stages]
        self.f = [s.fwd_time for s in p.stages]
        self.opts = [s.options for s in p.stages]
        self.s = [[self.x[i][i + 1] + o.saved for o in self.opts[i]] for i in range(L)]
        self.loss_need = self.g[L] + p.loss_tmp
        self.loss_time = p.loss_time


class _Needs:
    """The memory each move of the recursion needs besides a_i (module docstring), in
    slots of ``slot`` bytes, each term rounded up (``slot=1``: bytes, exact): the one
    rule :func:`least_memory`, :func:`least_slots`, :func:`least_memory_ops` and
    :class:`_Table` read."""

    def __init__(self, z: _Sizes, slot: int = 1) -> None:
        self.z, self.slot = z, slot
        L, q = z.L, self.q
        self.g = [q(b) for b in z.g]
        self.s = [[q(b) for b in row] for row in z.s]
        self.x = [[q(b) for b in row] for row in z.x]
        self.loss = q(z.loss_need)
        self.rec = [[q(o.rec_tmp) for o in opts] for opts in z.opts]
        # the backward's need: saved, d_{i+1}, the new cotangents, its net temporaries
        self.bwd = [
            [self.s[i][o] + self.g[i + 1] + q(z.gnew[i]) + q(opt.bwd_tmp - opt.bwd_release)
             for o, opt in enumerate(z.opts[i])]
            for i in range(L)
        ]  # fmt: skip
        # sweep[i][j]: besides a_i (and d_{t+1}), what F_ck(i) F_n(i+1..j-1) need
        self.sweep = [[0] * (L + 1) for _ in range(L + 1)]
        for i in range(L):
            need = self.x[i][i + 1] + q(z.ftmp[i])
            for j in range(i + 1, L + 1):
                if j - 1 > i:
                    need = max(need, q(z.pair[i][j - 1]) + q(z.ftmp[j - 1]))
                self.sweep[i][j] = need

    def q(self, nbytes: int) -> int:
        """Bytes -> slots, rounded up (negative bytes too: a net release)."""
        return -(-nbytes // self.slot)

    def record(self, i: int, t: int, o: int) -> int:
        """What recording stage i with option o needs, stages i+1..t after it."""
        return max(self.g[t + 1] + self.s[i][o] + self.rec[i][o], self.bwd[i][o])

    def split(self, i: int, j: int, t: int) -> int:
        """What ``F_ck(i) F_n(i+1..j-1)`` needs with d_{t+1} resident."""
        return self.g[t + 1] + self.sweep[i][j]

    def least(self) -> np.ndarray:
        """``need[i, t]``: the least memory of stages i..t over every persistent
        schedule (the recursion's minimum over its moves; int64, ``need[i + 1, i]`` = 0).
        The splits of (i, t) are one vectorized pass over j: the same integers as the
        recursion written out."""
        L = self.z.L
        need = np.zeros((L + 2, L + 1), dtype=np.int64)
        need[L, L] = self.loss
        x = np.asarray(self.x, dtype=np.int64)
        sweep = np.asarray(self.sweep, dtype=np.int64)
        for i in range(L - 1, -1, -1):
            for t in range(i, L + 1):
                best = min(
                    max(self.record(i, t, o), self.s[i][o] + int(need[i + 1, t]))
                    for o in range(len(self.s[i]))
                )
                if t > i:  # splits at j = i+1..t
                    split = np.maximum(self.g[t + 1] + sweep[i, i + 1 : t + 1],
                                       x[i, i + 1 : t + 1] + need[i + 1 : t + 1, t])  # fmt: skip
                    np.maximum(split, need[i, i:t], out=split)
                    best = min(best, int(split.min()))
                need[i, t] = best
        return need


def least_memory(p: BlockChain) -> tuple[int, np.ndarray]:
    """The least budget (bytes, a_0 included) of any persistent schedule, and the
    table ``need[i, t]`` (bytes besides a_i) behind it; exact integers."""
    z = _Sizes(p)
    need = _Needs(z).least()
    return z.x0 + int(need[0, z.L]), need


def _ops(L: int, choose, m: int) -> tuple[tuple, list[int | None]]:
    """Ops of the persistent schedule whose moves ``choose(i, t, m)`` picks, and the
    option recorded for each stage. Moves: ("record", o, m_rest) or ("split", j, m_right)."""
    ops: list = []
    options: list[int | None] = [None] * L
    stack: list = [("solve", 0, L, m)]
    while stack:
        item = stack.pop()
        if item[0] == "emit":
            ops.append(item[1])
            continue
        _, i, t, m = item
        if i == t + 1:
            continue
        if i == L:
            ops.append(Loss())
            continue
        move = choose(i, t, m)
        if move[0] == "record":
            _, o, rest = move
            options[i] = o
            ops.append(F_all(i))
            stack.append(("emit", B(i)))
            stack.append(("solve", i + 1, t, rest))
        else:
            _, j, right = move
            ops.append(F_ck(i))
            ops.extend(F_n(k) for k in range(i + 1, j))
            stack.append(("solve", i, j - 1, m))
            stack.append(("solve", j, t, right))
    return tuple(ops), options


def least_memory_ops(
    p: BlockChain, budget: int, prefer: list[list[int]] | None = None
) -> tuple[tuple, list]:
    """A schedule that fits ``budget`` whenever it is at least :func:`least_memory`;
    ``prefer[i]``: stage i's options in the order to try (default: by index)."""
    z = _Sizes(p)
    n = _Needs(z)
    need = n.least()
    least = z.x0 + int(need[0, z.L])
    if budget < least:
        raise ValueError(f"budget {budget} < least feasible {least}")

    def choose(i: int, t: int, m: int):
        for o in prefer[i] if prefer else range(len(z.opts[i])):
            if max(n.record(i, t, o), z.s[i][o] + need[i + 1, t]) <= m:
                return ("record", o, m - z.s[i][o])
        for j in range(t, i, -1):
            if max(n.split(i, j, t), z.x[i][j] + need[j, t], need[i, j - 1]) <= m:
                return ("split", j, m - z.x[i][j])
        raise AssertionError(f"no move fits stages {i}..{t} in {m} bytes")  # pragma: no cover

    return _ops(z.L, choose, budget - z.x0)


class _Table:
    """C(m, i, t) for m = 0..M slots (sizes rounded up to ``slot`` bytes).

    A row is computed once per distinct sub-problem: rows whose moves read the same
    numbers and the same rows below (a transformer's layers repeat, so do the rows of
    their sub-chains) are one array. The forward time of ``F_ck(i) F_n(i+1..j-1)`` is
    summed from stage i on (``fwd[i][j]``), so that repeated stages give the same
    float."""

    def __init__(self, p: BlockChain, M: int, slot: int) -> None:
        z = _Sizes(p)
        n = _Needs(z, slot)
        self.z, self.n, self.M, self.slot = z, n, M, slot
        L, W = z.L, M + 1
        self.fwd = [[0.0] * (L + 1) for _ in range(L + 1)]  # fwd[i][j]: f[i] + .. + f[j-1]
        for i in range(L):
            total = 0.0
            for j in range(i + 1, L + 1):
                total += z.f[j - 1]
                self.fwd[i][j] = total
        self.rows: dict[tuple[int, int], np.ndarray] = {}
        row_id: dict[tuple[int, int], int] = {}  # (i, t) -> its sub-problem's number
        numbered: dict[tuple, int] = {}  # what a row's moves read -> its number
        inf = np.full(W, np.inf)
        loss = inf.copy()
        loss[min(n.loss, W) :] = z.loss_time
        self.rows[L, L] = loss
        row_id[L, L] = numbered.setdefault(("loss", n.loss, z.loss_time), len(numbered))
        shifted: dict[tuple[int, int], np.ndarray] = {}  # (row number, k) -> row shifted by k
        computed: dict[int, np.ndarray] = {}  # row number -> its row

        def shift(j: int, t: int, k: int) -> np.ndarray:
            key = (row_id[j, t], k)
            if key not in shifted:
                out = np.full(W, np.inf)
                if k < W:
                    out[k:] = self.rows[j, t][: W - k]
                shifted[key] = out
            return shifted[key]

        for i in range(L - 1, -1, -1):
            for t in range(i, L + 1):
                records = tuple(
                    (n.s[i][o], n.record(i, t, o), opt.rec_time + opt.bwd_time)
                    for o, opt in enumerate(z.opts[i])
                )  # fmt: skip
                splits = tuple(
                    (n.split(i, j, t), n.x[i][j], self.fwd[i][j], row_id[j, t], row_id[i, j - 1])
                    for j in range(i + 1, t + 1)
                )  # fmt: skip
                key = (records, row_id[i + 1, t] if t > i else -1, splits)
                number = numbered.setdefault(key, len(numbered))
                row_id[i, t] = number
                if number in computed:  # the same moves on the same rows: the same row
                    self.rows[i, t] = computed[number]
                    continue
                best = np.full(W, np.inf)
                for o, opt in enumerate(z.opts[i]):
                    s, thr = n.s[i][o], n.record(i, t, o)
                    base = opt.rec_time + opt.bwd_time
                    cand = np.full(W, np.inf)
                    if t == i:
                        cand[min(thr, W) :] = base
                    elif s < W:
                        cand[s:] = base + self.rows[i + 1, t][: W - s]
                        cand[: min(thr, W)] = np.inf
                    np.minimum(best, cand, out=best)
                for j in range(i + 1, t + 1):
                    thr = n.split(i, j, t)
                    if thr >= W:
                        continue
                    cand = shift(j, t, n.x[i][j]) + self.rows[i, j - 1]
                    cand += self.fwd[i][j]
                    cand[:thr] = np.inf
                    np.minimum(best, cand, out=best)
                self.rows[i, t] = computed[number] = best

    def value(self, m: int) -> float:
        return float(self.rows[0, self.z.L][min(m, self.M)])

    def choose(self, i: int, t: int, m: int):
        z, n = self.z, self.n
        best, move = math.inf, None
        for o, opt in enumerate(z.opts[i]):
            s = n.s[i][o]
            if m < n.record(i, t, o):
                continue
            rest = 0.0 if t == i else self.rows[i + 1, t][m - s]
            value = opt.rec_time + opt.bwd_time + rest
            if value < best:
                best, move = value, ("record", o, m - s)
        for j in range(i + 1, t + 1):
            xj = n.x[i][j]
            if m < n.split(i, j, t) or m < xj:
                continue
            value = self.fwd[i][j] + self.rows[j, t][m - xj] + self.rows[i, j - 1][m]
            if value < best:
                best, move = value, ("split", j, m - xj)
        if move is None:  # pragma: no cover - only called where the table is finite
            raise AssertionError(f"no move for stages {i}..{t} at {m} slots")
        return move


def least_slots(z: _Sizes, slot: int) -> int:
    """The fewest slots of ``slot`` bytes (a_0 aside) at which :class:`_Table`'s value is
    finite: the same needs, rounded up the same way (:class:`_Needs`), as integers
    (``O(L^2)`` moves instead of a row of ``M`` slots each). Where it exceeds the table's
    slots, that table finds nothing: at budgets near the least one the discretized
    tables do not fit (:func:`block_rotor` skips building them)."""
    return int(_Needs(z, slot).least()[0, z.L])


def table_bytes(p: BlockChain, slots: int) -> int:
    """Bytes of the DP's tables for ``slots`` memory slots (one float64 row per (i, t))."""
    n = p.length + 1
    return 8 * (n * (n + 1) // 2) * (slots + 1) * 2


def store_all(p: BlockChain) -> tuple[tuple, list[int]]:
    """Every stage recorded with its fastest option (least saved bytes among ties)."""
    L = p.length

    def cost(option) -> tuple[float, int]:
        return option.rec_time + option.bwd_time, option.saved

    options = [min(range(len(s.options)), key=lambda o, s=s: cost(s.options[o])) for s in p.stages]
    ops = [F_all(k) for k in range(L)] + [Loss()] + [B(k) for k in range(L - 1, -1, -1)]
    return tuple(ops), options


def uniform_options(p: BlockChain, ops: tuple, options: list[int], budget: int) -> list[int]:
    """``options`` with ties broken towards one option per kind of stage.

    The DP is indifferent between options of equal cost, so identical blocks (a
    transformer's layers, a scan's iterations) may alternate between them, and the
    compiled path keeps a run of identical blocks as one loop only where they share an
    option (:mod:`jax_exec.execute.loops`). Each stage whose option differs from the most
    common one among stages with the same options takes it when the schedule still fits
    ``budget`` and is no slower (a tie)."""
    groups: dict = {}
    for k, stage in enumerate(p.stages):
        groups.setdefault((stage.options, stage.fwd_time, stage.fwd_tmp), []).append(k)
    options = list(options)
    trace = simulate_blocks(p, BlockSchedule(ops, {}, options))
    for members in groups.values():
        if len(members) < 2:
            continue
        counts: dict[int, int] = {}
        for k in members:
            counts[options[k]] = counts.get(options[k], 0) + 1
        common = max(counts, key=lambda o: (counts[o], -o))
        for k in members:
            if options[k] == common:
                continue
            trial = options[:k] + [common] + options[k + 1 :]
            new = simulate_blocks(p, BlockSchedule(ops, {}, trial))
            if new.peak_memory <= budget and new.makespan <= trace.makespan:
                options, trace = trial, new
    return options


@register(
    "block_rotor",
    problem=BlockChain,
    exact=True,
    description="rotor's recursion with a save option per recorded block (Rockmate's DP)",
)
def block_rotor(
    problem: BlockChain, budget: int, *, max_slots: int = 5_000, slots: int = 1_000
) -> BlockSchedule:
    """Optimal persistent schedule of ``problem`` under ``budget`` bytes (module doc).

    A :class:`BlockSchedule` whose ``options`` are the chosen option of every stage;
    ``meta["exact"]`` is
    False when sizes were discretized (``meta["discretization"]``: slot size, slots).
    """
    least, _ = least_memory(problem)
    if budget < least:
        raise Infeasible("block_rotor", budget, least)
    ops, options = store_all(problem)
    peak = simulate_blocks(problem, BlockSchedule(ops, {}, options)).peak_memory
    if peak <= budget:  # nothing to recompute: the fastest options, all recorded
        return BlockSchedule(ops, {"exact": True, "dp": "store_all"}, options)
    sizes = _Sizes(problem)
    room = min(budget, peak) - sizes.x0
    grid = slots
    while True:
        slot = 1 if room <= max_slots else -(-room // grid)
        M = room // slot
        table = _Table(problem, M, slot) if least_slots(sizes, slot) <= M else None
        if table is not None and math.isfinite(table.value(M)):
            ops, options = _ops(problem.length, table.choose, M)
            options = uniform_options(problem, ops, options, budget)
            ops_meta: dict = {
                "exact": slot == 1,
                "dp": "table",
                "dp_value": table.value(M),
            }
            if slot > 1:
                ops_meta["discretization"] = {"slot_size": slot, "slots": M}
            return BlockSchedule(ops, ops_meta, options)
        if slot == 1 or grid >= max_slots:
            ops, options = least_memory_ops(problem, budget)
            meta = {"exact": False, "fallback": "min_memory", "slots": grid}
            return BlockSchedule(ops, meta, options)
        grid = min(2 * grid, max_slots)
