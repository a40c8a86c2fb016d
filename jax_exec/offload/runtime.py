"""Executing offload schedules (docs/offload.md): the op-by-op runtime with host memory.

``run_offload`` runs a :class:`schedir.OffloadSchedule` like :func:`jax_exec.run` runs a
chain schedule, plus the copy ops, with ``jax.device_put`` between the device's
default memory and its ``pinned_host`` memory kind (available on CPU too):

- ``Offload(buf)``: start ``device_put`` of the buffer's arrays to ``pinned_host``; the
  device arrays stay alive (the copy reads them);
- ``Wait(buf)`` after an offload: block on the host copy, then delete the device arrays;
- ``Prefetch(buf)``: start ``device_put`` back to device memory; the new device arrays
  count from now on;
- ``Wait(buf)`` after a prefetch: block on the device copy, delete the host arrays.

Device and host resident bytes are measured separately from the arrays held (their
``nbytes`` and ``sharding.memory_kind``), after every op; they equal the simulator's
program-order ``resident`` / ``host_resident`` (``schedir.simulate_offload``).
:func:`measure_platform` times ``device_put`` each way on the current backend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jax_exec.chain.runtime import chain_result, chain_step, compute, input_buffers
from jax_exec.execute.result import OpMeter, RunResult
from jax_exec.execute.tree import unit_chain
from schedir import (
    B,
    CopyEngine,
    F_all,
    F_ck,
    F_n,
    InvalidSchedule,
    Loss,
    Offload,
    OffloadProblem,
    OffloadSchedule,
    Platform,
    Prefetch,
    Wait,
    simulate_offload,
)
from schedir.chain.ops import buffer_moves

# The one result type (kept importable under its old name).
OffloadRunResult = RunResult


def _parse(name: str) -> tuple[str, int]:
    kind, k = name[:-1].split("[")
    return kind, int(k)


def _memory(kind: str):
    device = jax.devices()[0]
    return jax.sharding.SingleDeviceSharding(device, memory_kind=kind)


def run_offload(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    schedule: OffloadSchedule | Sequence,
    x: jax.Array,
    y: Any,
) -> RunResult:
    """Run one training step of ``layers`` following an offload schedule, op by op."""
    model, step, x = chain_step(layers, loss_fn, x, y)
    L = len(step.stages)
    ops = schedule.ops if isinstance(schedule, OffloadSchedule) else OffloadSchedule(schedule).ops
    simulate_offload(OffloadProblem(unit_chain(L), Platform.host_offload(math.inf)), ops)
    host_kind, device_kind = _memory("pinned_host"), _memory("device")

    buf = input_buffers(x)
    host: dict[tuple[str, int], tuple] = {}
    pending: dict[tuple[str, int], str] = {}
    grads: list = [None] * L
    loss = None
    meter = OpMeter(buf.bytes())

    def host_bytes() -> int:
        return sum(int(a.nbytes) for arrays in host.values() for a in arrays)

    for op in ops:
        start = time.perf_counter()
        need, temp = None, 0
        if isinstance(op, Offload):
            name = _parse(op.buffer)
            host[name] = tuple(jax.device_put(a, host_kind) for a in buf.table[name])
            pending[name] = "offload"
        elif isinstance(op, Prefetch):
            name = _parse(op.buffer)
            buf.put(name, tuple(jax.device_put(a, device_kind) for a in host[name]))
            pending[name] = "prefetch"
        elif isinstance(op, Wait):
            name = _parse(op.buffer)
            if pending.pop(name, None) == "offload":
                jax.block_until_ready(host[name])
                buf.drop(name)
            elif name in buf.table and name in host:  # a prefetch: the host copy goes
                jax.block_until_ready(buf.table[name])
                for a in host.pop(name):
                    a.delete()
        elif isinstance(op, Loss | B | F_ck | F_n | F_all):
            reads, _, _ = buffer_moves(op, L, buf.table)  # the IR's op table
            for name in reads:
                if pending.get(name) == "prefetch":  # a compute op waits for its inputs
                    pending.pop(name)
                    jax.block_until_ready(buf.table[name])
                    for a in host.pop(name):
                        a.delete()
            need, temp, value = compute(op, buf, step, grads)
            loss = value if value is not None else loss
        else:  # pragma: no cover - OffloadSchedule rejects foreign ops
            raise InvalidSchedule(f"{op!r} cannot run (Evict: weights are not executed here)")
        for arrays in buf.table.values():
            for a in arrays:
                if a.sharding.memory_kind not in (None, "device"):  # pragma: no cover
                    raise AssertionError(f"a device buffer lives in {a.sharding.memory_kind}")
        live = buf.bytes()
        seconds = time.perf_counter() - start
        meter.record(seconds, temp, live if need is None else need, live, host=host_bytes())
    meter.stop()
    buf.clear()
    for arrays in host.values():
        for a in arrays:
            a.delete()
    return chain_result(meter, model, loss, grads, x, y, ops)


def measure_platform(
    nbytes: int = 1 << 24, *, repeats: int = 5, device_memory: int | None = None
) -> Platform:
    """A :class:`schedir.Platform` whose copy engines are timed on the current backend.

    Times ``jax.device_put`` of ``nbytes`` (and of 4 bytes, for the latency) to and from
    ``pinned_host``; median of ``repeats`` after a warm-up.
    """
    host_kind, device_kind = _memory("pinned_host"), _memory("device")

    def timed(n: int, kind, back) -> float:
        src = jax.device_put(jax.numpy.zeros(max(1, n // 4), jax.numpy.float32), back)
        samples = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            jax.block_until_ready(jax.device_put(src, kind))
            samples.append(time.perf_counter() - t0)
        return sorted(samples[1:])[len(samples[1:]) // 2]

    engines = []
    for kind, back in ((host_kind, device_kind), (device_kind, host_kind)):
        latency = timed(4, kind, back)
        big = max(timed(nbytes, kind, back) - latency, 1e-9)
        engines.append(CopyEngine(nbytes / big, latency))
    return Platform(device_memory=device_memory, offload=engines[0], prefetch=engines[1])
