"""The two-stream simulator of offload schedules: :func:`simulate_offload`.

Program order decides validity and the ``resident`` figures; a timed event list
(compute stream, offload engine, prefetch engine) gives the device and host memory
curves. Events at the same instant are ordered: device releases of finished copies
first, then the ops in program order (an op's allocation before its frees), then copy
starts that were delayed by a busy engine. Rules are in ``docs/offload.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from schedir.chain.ops import (
    B,
    Loss,
    MissingBuffer,
    backward_index,
    buffer_name,
    check_complete_step,
    effect,
)
from schedir.chain.schedule import Schedule
from schedir.errors import InvalidSchedule
from schedir.offload.effects import CopyEffect, CopyStates
from schedir.offload.engines import CopyEngines
from schedir.offload.ops import Evict, Offload, OffloadSchedule, Prefetch, Wait, is_compute
from schedir.offload.problem import OffloadProblem
from schedir.trace import Span

FIRST, LAST = -math.inf, math.inf


@dataclass(frozen=True)
class OffloadTrace:
    """What a schedule does on an :class:`OffloadProblem`.

    Attributes:
        makespan: end of the last op on any stream, seconds.
        peak_memory: peak of the timed device memory curve, bytes.
        program_peak: max of ``initial_memory`` and ``op_peak`` (program order), bytes.
        host_peak: peak host bytes (offloaded activations, weights, gradients).
        initial_memory: device bytes before the first op (x_0).
        resident: device bytes after each op in program order (an offloaded buffer
            counts until its ``Wait``, a prefetched one from its ``Prefetch``).
        op_peak: program-order bytes each op needs (compute ops: resident after adding
            the output, plus temporaries; other ops: resident after them).
        host_resident: host bytes after each op (program order).
        start, end: per op, seconds: compute ops on the compute stream, copy ops the
            copy itself, ``Wait`` the compute stream's wait (``Evict``: instant).
        stream: per op, ``"compute"``, ``"offload"``, ``"prefetch"`` or ``"wait"``.
        device_curve, host_curve: ``(time, bytes)`` after every memory event, in order.
        ops: the ops.
        buffers: device-resident buffer names after each op (when asked for).
    """

    makespan: float
    peak_memory: int
    program_peak: int
    host_peak: int
    initial_memory: int
    resident: tuple[int, ...]
    op_peak: tuple[int, ...]
    host_resident: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    stream: tuple[str, ...]
    device_curve: tuple[tuple[float, int], ...]
    host_curve: tuple[tuple[float, int], ...]
    ops: tuple
    buffers: tuple[frozenset[str], ...] | None = None


def _as_offload_ops(schedule_or_ops) -> tuple:
    if isinstance(schedule_or_ops, OffloadSchedule):
        return schedule_or_ops.ops
    if isinstance(schedule_or_ops, Schedule):
        return schedule_or_ops.ops  # a plain chain schedule: no copy ops
    return OffloadSchedule(tuple(schedule_or_ops)).ops


def simulate_offload(
    problem: OffloadProblem, schedule_or_ops: Schedule | Iterable, *, record_buffers: bool = False
) -> OffloadTrace:
    """Run a schedule with copy ops on ``problem`` and return its :class:`OffloadTrace`.

    Raises :class:`InvalidSchedule` (op index, op, buffer) when an op cannot run, when
    the step is incomplete, or when host memory exceeds ``platform.host_memory``.

    >>> from schedir import Chain, F_all, Loss, B, Platform
    >>> c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    >>> p = OffloadProblem(c, Platform.host_offload(4.0))
    >>> t = simulate_offload(p, [Offload("a[0]"), F_all(0), Wait("a[0]"),
    ...                          Prefetch("a[0]"), Loss(), Wait("a[0]"), B(0)])
    >>> t.makespan, t.peak_memory, t.program_peak
    (4.0, 28, 28)
    """
    return run(problem, _as_offload_ops(schedule_or_ops), record_buffers)


@dataclass
class _Copy:
    direction: str  # "offload" | "prefetch"
    start: float
    end: float
    readers_end: float
    waited: bool = False


def run(problem: OffloadProblem, ops: tuple, record_buffers: bool) -> OffloadTrace:
    """The simulation behind :func:`simulate_offload` (``ops`` already checked)."""
    chain, platform = problem.chain, problem.platform
    L = chain.length
    x = chain.in_size + (0,)
    weights = problem.weight_size

    def size(buf: tuple[str, int]) -> int:
        kind, k = buf
        if kind == "abar":
            return chain.saved_size[k - 1]
        if kind in ("w", "g"):
            return weights[k]
        return x[k]

    def check_range(i: int, op, buf: tuple[str, int]) -> None:
        kind, k = buf
        hi = {"a": L, "d": L, "abar": L}.get(kind, L)
        lo = 1 if kind == "abar" else 0
        if kind in ("w", "g") and weights is None:
            raise fail(i, op, f"{buffer_name(buf)}: this problem does not model weights")
        if not lo <= k <= hi:
            raise fail(i, op, f"{buffer_name(buf)} out of range ({kind}[{lo}..{hi}])")

    def fail(i: int, op, why: str) -> InvalidSchedule:
        return InvalidSchedule(f"op {i}: {op}: {why}")

    host0 = {("w", k) for k in range(L + 1)} if weights is not None else set()
    states = CopyStates({("a", 0): "dev"}, host0)  # program order: the copy ops' rules
    device, host = states.device, states.host
    copies: dict[tuple[str, int], _Copy] = {}
    total, host_total = x[0], sum(weights or ())
    dev_events: list[tuple[float, float, int, int]] = []  # (time, key, seq, delta)
    host_events: list[tuple[float, float, int, int]] = [(0.0, FIRST, -1, host_total)]
    seq = 0

    def event(events: list, time: float, key: float, delta: int) -> None:
        nonlocal seq
        events.append((time, key, seq, delta))
        seq += 1

    tc = 0.0  # compute stream clock
    engine = CopyEngines()
    links = {"offload": platform.offload, "prefetch": platform.prefetch}
    done = [False] * (L + 1)
    res_after, host_after, op_peaks, starts, ends, streams, bufs = [], [], [], [], [], [], []

    def settled(effect: CopyEffect) -> float:
        """Account a prefetch waited for; the end of its copy."""
        nonlocal host_total
        if effect.host_drop:
            host_total -= size(effect.buffer)
        return copies[effect.buffer].end

    def release_offload(buf: tuple[str, int]) -> None:
        copy = copies[buf]
        copy.waited = True
        event(dev_events, max(copy.end, copy.readers_end), FIRST, -size(buf))

    for i, op in enumerate(ops):
        if is_compute(op):
            try:
                eff = effect(chain, op, device)
            except MissingBuffer as err:
                on_host = [b for b in err.wanted if b in host]
                why = ""
                if on_host and len(err.wanted) == 1:
                    why = " (it is on the host: Prefetch it first)"
                elif on_host:
                    why = f" ({buffer_name(on_host[0])} is on the host: Prefetch it first)"
                raise fail(i, op, f"{err}{why}") from None
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            k = L if isinstance(op, Loss) else op.index
            needed = list(eff.reads)
            if weights is not None and weights[k] > 0:
                needed.append(("w", k))
            for buf in needed:
                if buf not in device:
                    why = " (it is on the host: Prefetch it first)" if buf in host else ""
                    raise fail(i, op, f"needs {buffer_name(buf)}, which is not resident{why}")
            ready = max([tc, *(settled(e) for e in states.reads(tuple(needed)))])
            backward = backward_index(chain, op)
            if backward is not None and done[backward]:
                raise fail(i, op, "already ran (every backward runs exactly once)")
            outs, tmp, frees = list(eff.adds), eff.tmp, eff.frees
            if isinstance(op, B) and weights is not None and weights[k] > 0:
                outs.append(("g", k))
            start = ready
            end = start + eff.time
            added = 0
            for buf in outs:
                try:
                    states.add(buf)
                except InvalidSchedule as err:
                    raise fail(i, op, str(err)) from None
                added += size(buf)
            total += added
            need = total + tmp
            event(dev_events, start, 2 * i, added + tmp)
            freed = 0
            for buf in frees:
                try:
                    states.free(buf)
                except InvalidSchedule as err:
                    raise fail(i, op, str(err)) from None
                freed += size(buf)
            for buf in needed:
                if device.get(buf) == "off":
                    copies[buf].readers_end = max(copies[buf].readers_end, end)
            total -= freed
            event(dev_events, end, 2 * i + 1, -(tmp + freed))
            if backward is not None:
                done[backward] = True
            tc = end
            stream = "compute"
        elif isinstance(op, Offload | Prefetch | Wait | Evict):
            buf = op.key
            check_range(i, op, buf)
            start = end = tc
            need = None
            try:
                change = states.effect(op)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            if change.starts is not None:
                direction = change.starts
                start, end = engine.issue(direction, tc, links[direction].time(size(buf)))
                if math.isinf(end):
                    raise fail(i, op, f"the {direction} engine has zero bandwidth")
                copies[buf] = _Copy(direction, start, end, start)
                key = 2 * i if start == tc else LAST
                if direction == "offload":
                    host_total += size(buf)
                    event(host_events, start, key, size(buf))
                else:
                    total += size(buf)
                    event(dev_events, start, key, size(buf))
                    if buf[0] != "w":
                        event(host_events, end, FIRST, -size(buf))
                stream = direction
            elif isinstance(op, Wait):
                if change.device_drop:  # an offload waited for: the device copy goes
                    release_offload(buf)
                    total -= size(buf)
                elif change.waits_for == "prefetch":
                    settled(change)
                end = max(tc, copies[buf].end)
                tc = end
                stream = "wait"
            else:  # Evict
                total -= size(buf)
                event(dev_events, tc, FIRST, -size(buf))
                stream = "wait"
        else:  # pragma: no cover - OffloadSchedule rejects foreign ops
            raise fail(i, op, "not a chain or copy op")
        op_peaks.append(total if need is None else need)
        res_after.append(total)
        host_after.append(host_total)
        starts.append(start)
        ends.append(end)
        streams.append(stream)
        if record_buffers:
            bufs.append(frozenset(buffer_name(b) for b in device))

    check_complete_step(done, len(ops))
    for buf, copy in copies.items():
        if copy.direction == "offload" and not copy.waited:
            release_offload(buf)

    def curve(events: list, initial: int) -> tuple[tuple, int]:
        level, peak, points = initial, initial, []
        for time, _, _, delta in sorted(events):
            level += delta
            peak = max(peak, level)
            points.append((time, level))
        return tuple(points), peak

    dev_curve, peak = curve(dev_events, x[0])
    host_curve, host_peak = curve(host_events, 0)
    host_peak = max(host_peak, *host_after) if host_after else host_peak
    cap = platform.host_memory
    if cap is not None and host_peak > cap:
        raise InvalidSchedule(
            f"host memory exceeded: the schedule keeps up to {host_peak} bytes on the host, "
            f"platform.host_memory = {cap}"
        )
    makespan = max([tc, *(c.end for c in copies.values())])
    return OffloadTrace(
        makespan=makespan,
        peak_memory=peak,
        program_peak=max([x[0], *op_peaks]),
        host_peak=host_peak,
        initial_memory=x[0],
        resident=tuple(res_after),
        op_peak=tuple(op_peaks),
        host_resident=tuple(host_after),
        start=tuple(starts),
        end=tuple(ends),
        stream=tuple(streams),
        device_curve=dev_curve,
        host_curve=host_curve,
        ops=ops,
        buffers=tuple(bufs) if record_buffers else None,
    )


def offload_lanes(problem: OffloadProblem, schedule: Schedule, trace: OffloadTrace) -> dict:
    """Three lanes: ``compute`` (chain ops; kind = the op's class name), ``d2h`` (the
    offload engine's copies) and ``h2d`` (the prefetch engine's); ``Wait``/``Evict``
    are idle time on the compute stream and are not drawn."""
    out: dict[str, list[Span]] = {"compute": [], "d2h": [], "h2d": []}
    lane = {"compute": "compute", "offload": "d2h", "prefetch": "h2d"}
    for op, s, e, stream in zip(trace.ops, trace.start, trace.end, trace.stream, strict=True):
        if stream in lane:
            kind = type(op).__name__ if stream == "compute" else "copy"
            out[lane[stream]].append(Span(s, e, str(op), kind))
    return out


def offload_memory(trace: OffloadTrace) -> tuple[list[float], list[int]]:
    """The timed device memory curve (what ``peak_memory`` is the peak of), as steps."""
    times, values = [0.0], [trace.initial_memory]
    for t, level in trace.device_curve:
        times.append(t)
        values.append(level)
    return times, values
