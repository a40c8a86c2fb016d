"""The copies between a device's memory and its ``pinned_host`` memory (JAX memory
kinds, available on CPU too), which the core's interpreter and lowering use for
offloaded buffers: :func:`carry_out` applies one copy effect of the offload simulator
to an executor's buffers (the op-by-op runtime's and the MPMD pipeline's);
:func:`measure_platform` times the copies on the backend at hand, for the offload
solvers' :class:`schedir.Platform`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from jax_exec.execute.buffers import HOST
from schedir import CopyEngine, Platform
from schedir.offload.effects import CopyEffect


def carry_out(
    change: CopyEffect, table: dict, to_host: Callable[[Any], Any],
    to_device: Callable[[Any], Any], drop: Callable[[Any], None],
) -> None:  # fmt: skip
    """Carry out one copy effect (:class:`schedir.offload.effects.CopyEffect`, the rules
    the offload simulator reads) on the buffers of ``table`` (buffer name -> its arrays;
    a buffer's host copy under ``("host", name)``): an offload starts the host copy
    (``to_host``) and the device arrays stay until its ``Wait`` drops them; a prefetch
    makes the device arrays (``to_device``), which count from then on, and its
    ``Wait`` drops the host copy where the effect says so. ``drop(key)`` forgets a
    buffer as the executor accounts it."""
    name, on_host = change.buffer, ("host", change.buffer)
    if change.starts == "offload":
        table[on_host] = to_host(table[name])
    elif change.starts == "prefetch":
        table[name] = to_device(table[on_host])
    elif change.device_drop:  # an offload waited for (or an eviction: no host copy)
        _wait(table.get(on_host))
        drop(name)
    elif change.waits_for == "prefetch":
        _wait(table[name])
        if change.host_drop:
            drop(on_host)


def _wait(arrays: Any) -> None:
    # a buffer's arrays by key (keys of mixed types: no pytree, whose keys must sort)
    jax.block_until_ready(list(arrays.values()) if isinstance(arrays, dict) else arrays)


def _memory(kind: str):
    device = jax.devices()[0]
    return jax.sharding.SingleDeviceSharding(device, memory_kind=kind)


def measure_platform(
    nbytes: int = 1 << 24, *, repeats: int = 5, device_memory: int | None = None
) -> Platform:
    """A :class:`schedir.Platform` whose copy engines are timed on the current backend.

    Times ``jax.device_put`` of ``nbytes`` (and of 4 bytes, for the latency) to and from
    ``pinned_host``; median of ``repeats`` after a warm-up.
    """
    host_kind, device_kind = _memory(HOST), _memory("device")

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
