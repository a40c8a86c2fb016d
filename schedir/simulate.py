"""The chain simulator: the judge of every chain schedule (docs/semantics.md, the op table).

Memory holds named buffers ``a[k]`` (x_k bytes), ``abar[k]`` (s_{k-1} bytes: a_k and the
residuals of the stage that produced it) and ``d[k]`` (x_k bytes). Execution starts
with ``a[0]`` resident. The memory an op needs is the sum of the resident buffers
right after it adds its output, plus its temporary bytes; peak memory is the maximum
of that over the ops and of the initial state. Makespan is the sum of the op times.

One choice the chain model leaves open is made here and documented in
``docs/semantics.md``: ``Loss`` behaves like the backward of stage L, so it frees
``a[L]`` if present (``abar[L]``, needed by ``B(L-1)``, stays). Without this the exact
DP of section 3.2 would not be realizable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schedir.chain.ops import B, F_all, F_ck, F_n, Loss
from schedir.chain.problem import Chain
from schedir.errors import InvalidSchedule
from schedir.schedule import Schedule, as_ops

Buffer = tuple[str, int]  # ("a" | "abar" | "d", k)


def buffer_name(buf: Buffer) -> str:
    """Printed form of a buffer, e.g. ``abar[3]``."""
    return f"{buf[0]}[{buf[1]}]"


@dataclass(frozen=True)
class Trace:
    """What a schedule does on a chain.

    Attributes:
        makespan: total time, seconds (sum of op times).
        peak_memory: bytes, max of ``initial_memory`` and every ``op_peak``.
        initial_memory: bytes resident before the first op (x_0).
        resident: bytes resident after each op.
        op_peak: bytes each op needs: resident after adding its output, plus its
            temporary bytes.
        start: start time of each op, seconds; ``end`` likewise.
        buffers: names of the resident buffers after each op (only when asked for).
    """

    makespan: float
    peak_memory: int
    initial_memory: int
    resident: tuple[int, ...]
    op_peak: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    ops: tuple
    buffers: tuple[frozenset[str], ...] | None = None


def op_time(chain: Chain, op) -> float:
    """Time of one op on ``chain``, seconds."""
    if isinstance(op, Loss):
        return chain.fwd_time[-1] + chain.bwd_time[-1]
    if isinstance(op, B):
        return chain.bwd_time[op.index]
    return chain.fwd_time[op.index]


def simulate_chain(
    chain: Chain, schedule_or_ops: Schedule | Iterable, *, record_buffers: bool = False
) -> Trace:
    """Run ``schedule_or_ops`` on ``chain`` and return its :class:`Trace`.

    Raises :class:`InvalidSchedule` naming the op index, the op and the missing buffer
    when an op cannot run, and when the sequence is not a complete training step
    (Loss and every ``B(k)`` exactly once, ending with ``d[0]``).

    >>> from schedir import Chain, F_all, Loss, B
    >>> c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    >>> t = simulate_chain(c, [F_all(0), Loss(), B(0)])
    >>> t.makespan, t.peak_memory
    (3.5, 28)
    """
    ops = as_ops(schedule_or_ops)
    L = chain.length
    x = chain.in_size + (0,)

    def size(buf: Buffer) -> int:
        kind, k = buf
        return chain.saved_size[k - 1] if kind == "abar" else x[k]

    resident: set[Buffer] = {("a", 0)}
    total = x[0]
    peak = total
    backward_done = [False] * (L + 1)  # index L is the loss
    clock = 0.0
    res_after, op_peaks, starts, ends, bufs = [], [], [], [], []

    def fail(i: int, op, why: str) -> InvalidSchedule:
        return InvalidSchedule(f"op {i}: {op}: {why}")

    def need_input(i: int, op, k: int) -> Buffer:
        for buf in (("a", k), ("abar", k)):
            if buf in resident:
                return buf
        raise fail(i, op, f"needs a[{k}] or abar[{k}], neither is resident")

    def add(i: int, op, buf: Buffer) -> None:
        nonlocal total
        if buf in resident:
            raise fail(i, op, f"{buffer_name(buf)} is already resident")
        resident.add(buf)
        total += size(buf)

    def remove(buf: Buffer) -> None:
        nonlocal total
        resident.remove(buf)
        total -= size(buf)

    for i, op in enumerate(ops):
        if isinstance(op, Loss):
            src = need_input(i, op, L)
            if backward_done[L]:
                raise fail(i, op, "the loss already ran (every backward runs exactly once)")
            add(i, op, ("d", L))
            need = total + chain.bwd_tmp[L]
            if src[0] == "a":
                remove(src)
            backward_done[L] = True
        else:
            k = op.index
            if k >= L:
                raise fail(i, op, f"stage {k} out of range 0..{L - 1} (the loss runs as Loss())")
            if isinstance(op, B):
                for buf in (("d", k + 1), ("abar", k + 1)):
                    if buf not in resident:
                        raise fail(i, op, f"needs {buffer_name(buf)}, which is not resident")
                src = need_input(i, op, k)
                if backward_done[k]:
                    raise fail(i, op, f"B({k}) already ran (every backward runs exactly once)")
                add(i, op, ("d", k))
                need = total + chain.bwd_tmp[k]
                if src[0] == "a":
                    remove(src)
                remove(("d", k + 1))
                remove(("abar", k + 1))
                backward_done[k] = True
            elif isinstance(op, F_ck | F_n | F_all):
                src = need_input(i, op, k)
                add(i, op, ("abar" if isinstance(op, F_all) else "a", k + 1))
                need = total + chain.fwd_tmp[k]
                if isinstance(op, F_n):
                    remove(src)
            else:  # pragma: no cover - Schedule() already rejects foreign ops
                raise fail(i, op, "not a chain op")
        peak = max(peak, need)
        op_peaks.append(need)
        res_after.append(total)
        starts.append(clock)
        clock += op_time(chain, op)
        ends.append(clock)
        if record_buffers:
            bufs.append(frozenset(buffer_name(b) for b in resident))

    missing = [f"B({k})" for k in range(L - 1, -1, -1) if not backward_done[k]]
    if not backward_done[L]:
        missing.insert(0, "Loss()")
    if missing:
        raise InvalidSchedule(
            f"op {len(ops)} (after the last op): incomplete training step, "
            f"{', '.join(missing)} never ran so d[0] is not computed"
        )
    return Trace(
        makespan=clock,
        peak_memory=peak,
        initial_memory=x[0],
        resident=tuple(res_after),
        op_peak=tuple(op_peaks),
        start=tuple(starts),
        end=tuple(ends),
        ops=ops,
        buffers=tuple(bufs) if record_buffers else None,
    )


# Problem type -> simulator. Other problem kinds (graphs, platforms) register here.
SIMULATORS: dict[type, object] = {Chain: simulate_chain}

# Problem type -> judge(problem, trace, budget) -> metadata dict, raising
# InvalidSchedule when the trace breaks the problem's limits. Problems without one are
# judged by ``budget_judge``; kinds whose limits live in the problem (per-device
# memories of a pipeline) register their own and accept ``budget=None``.
JUDGES: dict[type, object] = {}


def budget_judge(problem, trace, budget: int | None) -> dict:
    """The default: the simulated peak fits ``budget`` bytes."""
    if budget is None:
        raise InvalidSchedule(f"a {type(problem).__name__} needs a memory budget")
    if trace.peak_memory > budget:
        raise InvalidSchedule(f"peak memory {trace.peak_memory} exceeds the budget {budget}")
    return {"makespan": trace.makespan, "peak_memory": trace.peak_memory}


def judge(problem, trace, budget: int | None) -> dict:
    """Check ``trace`` against the limits of ``problem`` (and ``budget``); its metadata."""
    for kind, check in JUDGES.items():
        if isinstance(problem, kind):
            return check(problem, trace, budget)
    return budget_judge(problem, trace, budget)


# Problem type -> the schedule classes its simulator reads. A schedule object whose
# class is registered for other problem kinds only is refused before simulation: its
# ops name another kind's buffers. Other problem kinds register here
# (schedir/__init__.py registers the bundled ones).
SCHEDULES: dict[type, tuple[type, ...]] = {Chain: (Schedule,)}


def _most_derived(obj, classes) -> type | None:
    """The most derived of ``classes`` that ``obj`` is an instance of (None if none)."""
    found = [c for c in classes if isinstance(obj, c)]
    return max(found, key=lambda c: len(c.__mro__), default=None)


def check_schedule_kind(problem, schedule) -> None:
    """Raise :class:`InvalidSchedule` when ``schedule`` (a schedule object) belongs to
    another problem kind than ``problem`` (e.g. a graph schedule on a chain)."""
    kind = _most_derived(problem, SCHEDULES)
    registered = {c for classes in SCHEDULES.values() for c in classes}
    cls = _most_derived(schedule, registered)
    if kind is None or cls is None or cls in SCHEDULES[kind]:
        return  # op sequences and unregistered kinds: the simulator checks each op

    def name(c: type) -> str:  # 'Schedule (schedir.schedule)'
        fmt = getattr(c, "FORMAT", None)
        return f"{c.__name__} ({fmt})" if fmt else c.__name__

    owner = next(k.__name__ for k, classes in SCHEDULES.items() if cls in classes)
    what = name(cls)
    if not cls.__name__.lower().startswith(owner.lower()):  # 'chain Schedule (...)'
        what = f"{owner.lower()} {what}"
    article = "an" if what[0] in "AEIOUaeiou" else "a"
    raise InvalidSchedule(
        f"{article} {what} cannot run on a {kind.__name__}, which reads "
        f"{' or '.join(name(c) for c in SCHEDULES[kind])}"
    )


def simulate(problem, schedule_or_ops, **options) -> Trace:
    """Simulate a schedule on any problem kind (dispatch on the problem's type).

    Raises :class:`InvalidSchedule` when the schedule object is of another problem
    kind (``SCHEDULES``), TypeError when no simulator reads the problem.
    """
    kind = _most_derived(problem, SIMULATORS)
    if kind is None:
        known = ", ".join(k.__name__ for k in SIMULATORS)
        raise TypeError(f"simulate: no simulator for {type(problem).__name__} (known: {known})")
    check_schedule_kind(problem, schedule_or_ops)
    return SIMULATORS[kind](problem, schedule_or_ops, **options)
