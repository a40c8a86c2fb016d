"""The copies between a device's memory and its ``pinned_host`` memory (JAX memory
kinds, available on CPU too), which the core's interpreter and lowering use for
offloaded buffers: :func:`measure_platform` times them on the backend at hand, for the
offload solvers' :class:`schedir.Platform`."""

from __future__ import annotations

import time

import jax

from jax_exec.execute.buffers import HOST
from schedir import CopyEngine, Platform


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
