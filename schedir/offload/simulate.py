"""The two-stream simulator behind :func:`schedir.offload.simulate_offload`.

Program order decides validity and the ``resident`` figures; a timed event list
(compute stream, offload engine, prefetch engine) gives the device and host memory
curves. Events at the same instant are ordered: device releases of finished copies
first, then the ops in program order (an op's allocation before its frees), then copy
starts that were delayed by a busy engine. Rules are in ``docs/offload.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schedir.chain.ops import B, F_all, F_ck, F_n, Loss
from schedir.errors import InvalidSchedule
from schedir.simulate import op_time

FIRST, LAST = -math.inf, math.inf


@dataclass
class _Copy:
    direction: str  # "offload" | "prefetch"
    start: float
    end: float
    readers_end: float
    waited: bool = False


def _name(buf: tuple[str, int]) -> str:
    return f"{buf[0]}[{buf[1]}]"


def run(problem, ops: tuple, record_buffers: bool):
    from schedir.offload.problem import Evict, Offload, OffloadTrace, Prefetch, Wait

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
            raise fail(i, op, f"{_name(buf)}: this problem does not model weights")
        if not lo <= k <= hi:
            raise fail(i, op, f"{_name(buf)} out of range ({kind}[{lo}..{hi}])")

    def fail(i: int, op, why: str) -> InvalidSchedule:
        return InvalidSchedule(f"op {i}: {op}: {why}")

    device: dict[tuple[str, int], str] = {("a", 0): "dev"}  # "dev" | "off" | "pre"
    host: set[tuple[str, int]] = set()
    if weights is not None:
        host = {("w", k) for k in range(L + 1)}
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
    engine = {"offload": 0.0, "prefetch": 0.0}
    engines = {"offload": platform.offload, "prefetch": platform.prefetch}
    done = [False] * (L + 1)
    res_after, host_after, op_peaks, starts, ends, streams, bufs = [], [], [], [], [], [], []

    def settle_prefetch(buf: tuple[str, int]) -> float:
        """Program-order completion of a prefetch (implicit or explicit wait)."""
        nonlocal host_total
        copy = copies[buf]
        if not copy.waited:
            copy.waited = True
            device[buf] = "dev"
            if buf[0] != "w":
                host.discard(buf)
                host_total -= size(buf)
        return copy.end

    def release_offload(buf: tuple[str, int]) -> None:
        copy = copies[buf]
        copy.waited = True
        event(dev_events, max(copy.end, copy.readers_end), FIRST, -size(buf))

    for i, op in enumerate(ops):
        if isinstance(op, F_ck | F_n | F_all | Loss | B):
            k = L if isinstance(op, Loss) else op.index
            if k >= L and not isinstance(op, Loss):
                raise fail(i, op, f"stage {k} out of range 0..{L - 1} (the loss runs as Loss())")
            needed = []
            if isinstance(op, B):
                needed = [("d", k + 1), ("abar", k + 1)]
            src = next((b for b in (("a", k), ("abar", k)) if b in device), None)
            if src is None:
                where = [b for b in (("a", k), ("abar", k)) if b in host]
                why = f" ({_name(where[0])} is on the host: Prefetch it first)" if where else ""
                raise fail(i, op, f"needs a[{k}] or abar[{k}], neither is resident{why}")
            needed.append(src)
            if weights is not None and weights[k] > 0:
                needed.append(("w", k))
            ready = tc
            for buf in needed:
                if buf not in device:
                    why = " (it is on the host: Prefetch it first)" if buf in host else ""
                    raise fail(i, op, f"needs {_name(buf)}, which is not resident{why}")
                if device[buf] == "pre":
                    ready = max(ready, settle_prefetch(buf))
            if isinstance(op, Loss | B) and done[k]:
                raise fail(i, op, "already ran (every backward runs exactly once)")
            if isinstance(op, Loss):
                outs, tmp = [("d", L)], chain.bwd_tmp[L]
                frees = [src] if src[0] == "a" else []
            elif isinstance(op, B):
                outs, tmp = [("d", k)], chain.bwd_tmp[k]
                if weights is not None and weights[k] > 0:
                    outs.append(("g", k))
                frees = ([src] if src[0] == "a" else []) + [("d", k + 1), ("abar", k + 1)]
            else:
                outs = [("abar" if isinstance(op, F_all) else "a", k + 1)]
                tmp = chain.fwd_tmp[k]
                frees = [src] if isinstance(op, F_n) else []
            for buf in outs:
                if buf in device:
                    raise fail(i, op, f"{_name(buf)} is already resident")
                if buf in host:
                    raise fail(i, op, f"{_name(buf)} is on the host already (prefetch it)")
            start = ready
            end = start + op_time(chain, op)
            added = sum(size(b) for b in outs)
            for buf in outs:
                device[buf] = "dev"
            total += added
            need = total + tmp
            event(dev_events, start, 2 * i, added + tmp)
            freed = 0
            for buf in frees:
                if device[buf] == "off":
                    raise fail(i, op, f"frees {_name(buf)} while it is being offloaded")
                del device[buf]
                freed += size(buf)
            for buf in needed:
                if device.get(buf) == "off":
                    copies[buf].readers_end = max(copies[buf].readers_end, end)
            total -= freed
            event(dev_events, end, 2 * i + 1, -(tmp + freed))
            done[k] = done[k] or isinstance(op, Loss | B)
            tc = end
            stream = "compute"
        elif isinstance(op, Offload | Prefetch | Wait | Evict):
            buf = op.key
            check_range(i, op, buf)
            start = end = tc
            need = None
            if isinstance(op, Offload):
                if device.get(buf) != "dev":
                    state = {"off": "already being offloaded", "pre": "still being prefetched"}
                    raise fail(
                        i, op, f"{_name(buf)} is {state.get(device.get(buf), 'not resident')}"
                    )
                if buf in host:
                    raise fail(i, op, f"{_name(buf)} is already on the host (use Evict)")
                start = max(tc, engine["offload"])
                end = start + engines["offload"].time(size(buf))
                if math.isinf(end):
                    raise fail(i, op, "the offload engine has zero bandwidth")
                engine["offload"] = end
                copies[buf] = _Copy("offload", start, end, start)
                device[buf] = "off"
                host.add(buf)
                host_total += size(buf)
                event(host_events, start, 2 * i if start == tc else LAST, size(buf))
                stream = "offload"
            elif isinstance(op, Prefetch):
                if buf in device:
                    raise fail(i, op, f"{_name(buf)} is already on the device")
                if buf not in host:
                    raise fail(i, op, f"{_name(buf)} is not on the host (Offload and Wait first)")
                start = max(tc, engine["prefetch"])
                end = start + engines["prefetch"].time(size(buf))
                if math.isinf(end):
                    raise fail(i, op, "the prefetch engine has zero bandwidth")
                engine["prefetch"] = end
                copies[buf] = _Copy("prefetch", start, end, start)
                device[buf] = "pre"
                total += size(buf)
                event(dev_events, start, 2 * i if start == tc else LAST, size(buf))
                if buf[0] != "w":
                    event(host_events, end, FIRST, -size(buf))
                stream = "prefetch"
            elif isinstance(op, Wait):
                copy = copies.get(buf)
                if copy is None:
                    raise fail(i, op, f"no copy of {_name(buf)} was issued")
                if copy.direction == "offload" and not copy.waited:
                    release_offload(buf)
                    del device[buf]
                    total -= size(buf)
                elif copy.direction == "prefetch":
                    settle_prefetch(buf)
                end = max(tc, copy.end)
                tc = end
                stream = "wait"
            else:  # Evict
                if device.get(buf) != "dev" or buf not in host:
                    raise fail(i, op, f"{_name(buf)} needs a device copy and a host copy")
                del device[buf]
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
            bufs.append(frozenset(_name(b) for b in device))

    missing = [f"B({k})" for k in range(L - 1, -1, -1) if not done[k]]
    if not done[L]:
        missing.insert(0, "Loss()")
    if missing:
        raise InvalidSchedule(
            f"op {len(ops)} (after the last op): incomplete training step, "
            f"{', '.join(missing)} never ran so d[0] is not computed"
        )
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
