"""``rotor_offload``: optimal persistent schedules combining recomputation and offloading.

After Beaumont, Eyraud-Dubois, Shilova, "Efficient Combination of Rematerialization and
Offloading for Training DNNs" (NeurIPS 2021), restricted to a model in which the DP is
exact (docs/offload.md states it in full). The DP extends rotor's (Beaumont et al.
2019, docs/chain_solvers.md, ``model="tight"``) with two moves that offload the *input buffer* of
a sub-chain i..t (``a[i]``, or ``abar[i]`` when the sub-chain is the tail of a
recording) while it is not needed:

- *record-offload*: ``Offload(in) F_all(i) Wait(in)``, stages i+1..t with z more bytes,
  with ``Prefetch(in)`` issued just before their last op ``B(i+1)``, ``Wait(in) B(i)``;
- *split-offload at j*: ``Offload(in) F_ck(i) F_n(i+1..j-1) Wait(in)``, stages j..t with
  z more bytes and ``Prefetch(in)`` before their last op ``B(j)``, ``Wait(in)``, then
  stages i..j-1 as in rotor.

Assumptions (the model): one copy engine per direction, overlapping the compute
stream; an offload overlaps only the forward ops of its own move (F_all(i), or the
forward segment of the split) and the compute stream waits for it before going on; a
prefetch overlaps only the one op before the buffer is needed (the last op of the
sub-chain, whose memory is known: d, abar and temporaries of that stage), then the
compute stream waits for it. The offloaded buffer is counted on the device until the
``Wait`` after its offload (the simulator frees it earlier, when the copy ends, so the
simulated peak can only be lower) and from its prefetch's start. Only inputs of
sub-chains are offloaded, whole. Under these assumptions C(m, i, t, kind) is exact:
the moves of rotor are a subset (zero bandwidth gives rotor's optimum; offloading can
only help), and the simulated makespan equals the DP value.

Tables: two (kind ``a``: input a[i]; kind ``b``: input abar[i]) of shape
(L + 1 - i, W) per i, filled by vectorized numpy over m (no Python loop over memory).
Memory above the largest store-all need of any sub-chain does not change C, so W is
that need + 1 and larger indices are clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from schedir import (
    B,
    Chain,
    F_all,
    InvalidProblem,
    InvalidSchedule,
    Loss,
    Offload,
    OffloadProblem,
    OffloadSchedule,
    Prefetch,
    Wait,
    simulate_offload,
)
from schedir.chain.discretize import size_unit
from schedir.chain.problem import SIZE_FIELDS
from solvers.chain._rotor_dp import Needs
from solvers.chain._tree import record_first, segment_ops
from solvers.registry import Infeasible, register

INF = math.inf


def _round_up(chain: Chain, slot: int) -> Chain:
    return replace(
        chain, **{f: tuple(-(-v // slot) for v in getattr(chain, f)) for f in SIZE_FIELDS}
    )


@dataclass(frozen=True)
class Model:
    """Sizes (slots), costs (s) and needs of the moves of one problem; see module doc."""

    chain: Chain  # sizes in slots
    times: Chain  # the chain in bytes (times and transfer sizes)
    t_off: tuple  # t_off[kind][i]: seconds to offload the input of kind at i
    t_pre: tuple
    greedy: bool = False  # offload moves only when their transfers hide under compute

    @classmethod
    def of(cls, problem: OffloadProblem, slot: int = 1, *, greedy: bool = False) -> Model:
        byte = problem.chain
        L = byte.length
        sizes = [list(byte.in_size), [0] + list(byte.saved_size[:L])]  # z of kind a, b
        off, pre = problem.platform.offload, problem.platform.prefetch
        t_off = tuple(tuple(off.time(v) for v in row) for row in sizes)
        t_pre = tuple(tuple(pre.time(v) for v in row) for row in sizes)
        chain = byte if slot == 1 else _round_up(byte, slot)
        return cls(chain, byte, t_off, t_pre, greedy)

    def __post_init__(self) -> None:
        c = self.chain
        L = c.length
        a = c.arrays()
        x = a["in_size"]
        object.__setattr__(self, "L", L)
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "s", a["saved_size"])
        object.__setattr__(self, "z", (x[: L + 1], np.concatenate([[0], a["saved_size"][:L]])))
        bn = x[: L + 1] + x[1:] + a["saved_size"] + a["bwd_tmp"]
        bn[L] = x[L] + a["bwd_tmp"][L]  # the loss holds d_L and its temporary (semantics)
        object.__setattr__(self, "bn", bn)
        base = np.maximum(x[1:] + a["saved_size"] + a["fwd_tmp"], bn)
        base[L] = bn[L]
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "needs", Needs(c, tight=True))
        object.__setattr__(self, "pair", x[:-1] + x[1:] + a["fwd_tmp"])
        object.__setattr__(self, "ftmp", a["fwd_tmp"])
        t = self.times
        object.__setattr__(self, "op", np.asarray(t.fwd_time) + np.asarray(t.bwd_time))
        last = np.asarray(t.bwd_time, dtype=float).copy()
        last[L] += t.fwd_time[L]
        object.__setattr__(self, "last", last)
        object.__setattr__(self, "prefix", np.concatenate([[0.0], np.cumsum(t.fwd_time)]))

    def store_all_need(self) -> int:
        """Largest least-memory for no recomputation over every sub-chain (slots)."""
        L, x, s, bn = self.L, self.x, self.s, self.bn
        best = int(self.base.max())
        for t in range(L + 1):
            need = int(self.base[t])
            for i in range(t - 1, -1, -1):
                fn = x[t + 1] + s[i] + self.ftmp[i]
                need = int(max(fn, bn[i], s[i] + need))
                best = max(best, need)
        return best

    def candidates(self, C, right_cols, i: int, t: int, kind: int, ms: np.ndarray) -> list:
        """[(move, values)] for stages i..t (i < t) at memories ``ms``; move order fixed."""
        L, x, s, bn = self.L, self.x, self.s, self.bn
        W = C[0][L].shape[1]

        def at(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
            out = np.take_along_axis(values, np.clip(idx, 0, W - 1), axis=-1)
            return np.where(idx >= 0, out, INF)

        out = []
        fn = x[t + 1] + s[i] + self.ftmp[i]
        child = C[1][i + 1][t - i - 1][None]
        rec = self.op[i] + at(child, ms[None] - s[i])[0]
        rec[ms < max(fn, bn[i])] = INF
        out.append((("record",), rec))
        js = np.arange(i + 1, t + 1)
        # seg[j - i - 1]: the forward segment F_ck(i) (or F_all(i)) .. F_n(j - 1)
        seg = x[t + 1] + self.needs.inner(i)[: t - i]
        right = right_cols[t][i + 1 : t + 1]
        left = C[kind][i][0 : t - i][:, ms]
        fwd = self.prefix[js] - self.prefix[i]
        split = fwd[:, None] + at(right, ms[None] - x[js][:, None]) + left
        split[ms[None] < seg[:, None]] = INF
        out.append((("split",), split))
        if kind == 1 and i == 0:
            return out
        zi = int(self.z[kind][i])
        t_off, t_pre = self.t_off[kind][i], self.t_pre[kind][i]
        if math.isinf(t_off) or math.isinf(t_pre):
            return out
        if not self.greedy or (t_off <= self.times.fwd_time[i] and t_pre <= self.last[i + 1]):
            roff = (max(self.times.fwd_time[i], t_off) + max(0.0, t_pre - self.last[i + 1])
                    + self.times.bwd_time[i] + at(child, ms[None] - s[i] + zi)[0])  # fmt: skip
            roff[ms < max(fn, bn[i], s[i] + bn[i + 1])] = INF
            out.append((("record_off",), roff))
        cost = np.maximum(fwd, t_off) + np.maximum(0.0, t_pre - self.last[js])
        soff = cost[:, None] + at(right, ms[None] + zi - x[js][:, None]) + left
        soff[ms[None] < np.maximum(seg, bn[js] + x[js])[:, None]] = INF
        if self.greedy:
            soff[(t_off > fwd) | (t_pre > self.last[js])] = INF
        out.append((("split_off",), soff))
        return out


@dataclass(frozen=True)
class OffloadTable:
    """C(m, i, t, kind) for m = 0..width-1 (slots of ``slot`` bytes).

    Attributes:
        model: the sizes, costs and needs of the moves.
        slot: bytes per memory unit (1: exact in bytes).
        tables: ``tables[kind][i][t - i, m]``, seconds (inf: infeasible).
        right_cols: ``right_cols[t][j, m]`` = C(m, j, t, a), the right children of splits.
    """

    model: Model
    slot: int
    tables: tuple
    right_cols: tuple

    @property
    def width(self) -> int:
        return self.tables[0][0].shape[1]

    def memory(self, budget: int) -> int:
        """Slots besides x_0 available at ``budget`` bytes (-1 if below x_0)."""
        m = budget // self.slot - int(self.model.x[0])
        return min(m, self.width - 1) if m >= 0 else -1

    def value(self, budget: int) -> float:
        """Optimal makespan at ``budget`` bytes, seconds (inf when infeasible)."""
        m = self.memory(budget)
        return INF if m < 0 else float(self.tables[0][0][self.model.L, m])

    def min_budget(self) -> int | None:
        """Least budget (bytes, a multiple of the slot) with a finite value."""
        finite = np.flatnonzero(np.isfinite(self.tables[0][0][self.model.L]))
        return None if finite.size == 0 else int((finite[0] + self.model.x[0]) * self.slot)

    def choose(self, i: int, t: int, kind: int, m: int):
        ms = np.array([m])
        best, move = INF, None
        for label, values in self.model.candidates(self.tables, self.right_cols, i, t, kind, ms):
            flat = values.reshape(-1)
            k = int(np.argmin(flat))
            if flat[k] < best:
                best = flat[k]
                move = (label[0], i + 1 + k) if label[0].startswith("split") else (label[0], None)
        if move is None:
            raise AssertionError(f"no feasible move at ({i}, {t}, {kind}, {m})")
        return move

    def ops(self, budget: int) -> tuple:
        """Ops of an optimal schedule at ``budget`` bytes (which must be feasible)."""
        if not math.isfinite(self.value(budget)):
            raise ValueError(f"budget {budget} is infeasible for this table")
        return emit(self.model, self.choose, self.memory(budget), self.width)


def emit(model: Model, choose, m0: int, width: int) -> tuple:
    """Ops of the tree whose moves ``choose(i, t, kind, m)`` picks (explicit stack)."""
    L, x, s = model.L, model.x, model.s
    ops: list = []
    stack: list = [("solve", 0, L, 0, m0)]
    while stack:
        item = stack.pop()
        if item[0] == "emit":
            ops.append(item[1])
            continue
        if item[0] == "prefetch":  # issue the prefetch just before the last op so far
            ops.insert(len(ops) - 1, Prefetch(item[1]))
            continue
        _, i, t, kind, m = item
        m = min(m, width - 1)
        if i == t:
            ops.extend([Loss()] if i == L else [F_all(i), B(i)])
            continue
        move, j = choose(i, t, kind, m)
        buf = f"{'a' if kind == 0 else 'abar'}[{i}]"
        z = int(model.z[kind][i])
        if move in ("record", "record_off"):
            if move == "record_off":
                ops += [Offload(buf), F_all(i), Wait(buf)]
                stack += [("emit", B(i)), ("emit", Wait(buf)), ("prefetch", buf)]
                stack.append(("solve", i + 1, t, 1, m - s[i] + z))
            else:
                ops.append(F_all(i))
                stack += [("emit", B(i)), ("solve", i + 1, t, 1, m - s[i])]
        else:
            forward = segment_ops(i, j, record_first(model.chain, i, j))
            stack.append(("solve", i, j - 1, kind, m))
            if move == "split_off":
                ops += [Offload(buf), *forward, Wait(buf)]
                stack += [("emit", Wait(buf)), ("prefetch", buf)]
                stack.append(("solve", j, t, 0, m + z - x[j]))
            else:
                ops += forward
                stack.append(("solve", j, t, 0, m - x[j]))
    return tuple(ops)


def build_table(
    problem: OffloadProblem, slot: int = 1, *, greedy: bool = False, progress=None
) -> OffloadTable:
    """The DP table of ``problem`` with sizes rounded up to ``slot`` bytes;
    ``progress(fraction, message)`` after each row."""
    model = Model.of(problem, slot, greedy=greedy)
    L = model.L
    W = model.store_all_need() + 1
    ms = np.arange(W)
    tables = ([None] * (L + 1), [None] * (L + 1))
    right_cols = [np.full((t + 1, W), INF) for t in range(L + 1)]
    for i in range(L, -1, -1):
        for kind in (0, 1):
            row = np.full((L + 1 - i, W), INF)
            row[0, min(int(model.base[i]), W) :] = model.op[i]
            tables[kind][i] = row
            if kind == 1 and i == 0:
                continue
            for t in range(i + 1, L + 1):
                moves = model.candidates(tables, right_cols, i, t, kind, ms)
                best = row[t - i]
                for _, values in moves:
                    np.minimum(best, values if values.ndim == 1 else values.min(axis=0), out=best)
        for t in range(i, L + 1):
            right_cols[t][i] = tables[0][i][t - i]
        if progress is not None:
            done = 1 - (i * (i + 1)) / ((L + 1) * (L + 2))  # rows of i hold L + 1 - i entries
            progress(done, f"DP table, {L + 1 - i} of {L + 1} rows, width {W}")
    return OffloadTable(model, slot, (tuple(tables[0]), tuple(tables[1])), tuple(right_cols))


def slot_for(problem: OffloadProblem, max_units: int, slots: int) -> tuple[int, bool]:
    """(slot bytes, exact): the sizes' gcd when the table then has at most
    ``max_units`` units (exact), else about 1/``slots`` of the largest need (rounded up)."""
    need = Model.of(problem).store_all_need()
    unit = size_unit(problem.chain)
    if need // unit <= max_units:
        return unit, True
    return max(-(-need // slots), unit), False


def check_budget(problem: OffloadProblem, budget: int) -> int:
    """``budget`` if the device can hold it; InvalidProblem otherwise. (The tables clip
    memory at their width in Python integers: any budget is exact.)"""
    device = problem.platform.device_memory
    if device is not None and budget > device:
        raise InvalidProblem(f"budget {budget} exceeds platform.device_memory = {device} bytes")
    return budget


def host_fits(problem: OffloadProblem, ops: tuple) -> str | None:
    """None if the host holds what ``ops`` offload, else the simulator's reason."""
    if problem.platform.host_memory is None:
        return None
    try:
        simulate_offload(problem, ops)
    except InvalidSchedule as err:
        if "host memory" not in str(err):
            raise
        return str(err)
    return None


def solve_table(
    problem, budget, method, slot, exact, *, greedy=False, progress=None
) -> OffloadSchedule:
    """Solve with a table of ``slot`` bytes; rotor's schedule (no offload) when it does
    better or when the host cannot hold the table's offloads."""
    from solvers.chain._rotor_dp import min_memory
    from solvers.chain.rotor import rotor

    budget = check_budget(problem, budget)
    table = build_table(problem, slot, greedy=greedy, progress=progress)
    value = table.value(budget)
    meta = {"dp_value": value, "exact": exact and not greedy, "slot_size": slot}
    ops = table.ops(budget) if math.isfinite(value) else None
    note = host_fits(problem, ops) if ops is not None else None
    if note is not None:
        ops = None
    if ops is not None and meta["exact"]:
        return OffloadSchedule(ops, meta)
    least_rotor = min_memory(problem.chain, tight=True)
    if budget < least_rotor:
        if ops is not None:
            return OffloadSchedule(ops, meta)
        raise Infeasible(method, budget, _least_budget(problem, table, least_rotor), note or "")
    plain = rotor(problem.chain, budget).ops
    if ops is None or simulate_offload(problem, plain).makespan < value:
        meta.update(fallback="rotor", note=note or "rotor is better after discretization")
        meta["exact"] = meta["exact"] and note is None and ops is not None
        return OffloadSchedule(plain, meta)
    return OffloadSchedule(ops, meta)


def _least_budget(problem, table: OffloadTable, least_rotor: int) -> int | None:
    """The least budget at which :func:`solve_table` returns a schedule: the table's
    least (if the host holds that schedule's offloads) or rotor's; None if the host
    decides and the table's least does not fit it (the least is then unknown, at most
    rotor's)."""
    least = table.min_budget()
    if least is None or least >= least_rotor:
        return least_rotor
    if host_fits(problem, table.ops(least)) is None:
        return least
    return None


@register(
    "rotor_offload",
    problem=OffloadProblem,
    exact=True,
    description="optimal persistent remat + activation offload (DP, Beaumont et al. 2021)",
)
def rotor_offload(
    problem: OffloadProblem,
    budget: int,
    *,
    max_units: int = 3000,
    slots: int = 500,
    progress=None,
) -> OffloadSchedule:
    """Optimal schedule of the offload model (module doc) under ``budget`` device bytes.

    Exact (``meta["exact"]``) while the largest store-all need of a sub-chain is at most
    ``max_units`` units of the sizes' gcd; otherwise sizes are rounded up to slots of
    about 1/``slots`` of it (the schedule stays feasible in bytes) and rotor's schedule
    is returned if it is faster. Never worse than ``rotor`` in exact mode, by
    construction.
    If the host cannot hold the offloaded buffers, the best schedule without offloading
    is returned (``meta["fallback"] = "rotor"``) or Infeasible is raised.
    """
    slot, exact = slot_for(problem, max_units, slots)
    return solve_table(problem, budget, "rotor_offload", slot, exact, progress=progress)


def working_set(problem: OffloadProblem) -> int:
    """Least budget (bytes) of the schedule that records every stage and offloads every
    sub-chain input (prefetched one op ahead): with infinite bandwidth, rotor_offload
    reaches the store-all makespan at any budget >= this."""
    fast = replace(problem, platform=problem.platform.with_bandwidth(math.inf))
    ops = emit(Model.of(fast), lambda i, t, kind, m: ("record_off", None), 0, 1)
    return simulate_offload(fast, ops).program_peak
