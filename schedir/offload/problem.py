"""Offloading problems, copy ops, schedules and their two-stream simulator (docs/offload.md).

An :class:`OffloadProblem` pairs a chain with a :class:`~schedir.platform.Platform`
(device and host capacities, one copy engine per direction). A schedule mixes the
chain ops of docs/semantics.md with copy ops on named buffers (``a[k]``, ``abar[k]``,
``d[k]``; with ``weight_size`` also ``w[k]``, the weights of stage k, and ``g[k]``,
their gradient):

- ``Offload(buf)``: device -> host on the offload engine.
- ``Prefetch(buf)``: host -> device on the prefetch engine.
- ``Wait(buf)``: the compute stream waits until the last copy of ``buf`` ends.
- ``Evict(buf)``: drop the device copy of a buffer the host also holds (weights).

Timing. The compute stream runs the chain ops in order; a copy op is issued when the
compute stream reaches it (at the end of the previous compute op or Wait) and starts
when its engine is free. A compute op whose input is still being prefetched waits for
that copy. Makespan is the end of the last op of any stream.

Memory (exact rules in ``docs/offload.md``). A buffer being offloaded occupies the
device until its copy ends (and until every compute op that read it meanwhile ends);
a prefetched buffer occupies the device from its copy's start. The trace reports

- ``peak_memory``: the peak of the timed device curve (the physical peak);
- ``resident`` / ``op_peak``: program-order figures, what a runtime that only
  observes copies at ``Wait`` holds: an offloaded buffer is counted until its
  ``Wait``, a prefetched one from its ``Prefetch``. ``program_peak`` >= ``peak_memory``.

A schedule without copy ops has exactly the chain simulator's makespan and peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from schedir.chain.problem import MAX_TOTAL_SIZE, SIZE_FIELDS, Chain, _as_size, scaled_sum
from schedir.errors import InvalidProblem
from schedir.platform import Platform


@dataclass(frozen=True)
class OffloadProblem:
    """A chain to train on one device with a host memory (docs/offload.md).

    Attributes:
        chain: the chain (sizes in bytes, times in seconds).
        platform: ``device_memory`` / ``host_memory`` (bytes, None: unlimited) and the
            ``offload`` (device -> host) and ``prefetch`` copy engines.
        weight_size: optional bytes of the weights of each stage (L + 1 entries, index
            L the loss). None: weights are not modeled (always resident, not counted,
            as in the chain model). Given: every weight starts on the host, a stage's
            ops need ``w[k]`` on the device and ``B(k)`` adds its gradient ``g[k]``.
    """

    chain: Chain
    platform: Platform = field(default_factory=Platform)
    weight_size: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chain, Chain):
            raise InvalidProblem(f"chain = {self.chain!r}: expected a schedir.Chain")
        if not isinstance(self.platform, Platform):
            raise InvalidProblem(f"platform = {self.platform!r}: expected a schedir.Platform")
        if self.weight_size is not None:
            if isinstance(self.weight_size, str | bytes) or not hasattr(
                self.weight_size, "__len__"
            ):
                raise InvalidProblem(f"weight_size = {self.weight_size!r}: expected a sequence")
            sizes = tuple(self.weight_size)
            n = self.chain.length + 1
            if len(sizes) != n:
                raise InvalidProblem(f"weight_size has length {len(sizes)}, expected L + 1 = {n}")
            sizes = tuple(_as_size("weight_size", k, v) for k, v in enumerate(sizes))
            chain_total = sum(sum(getattr(self.chain, f)) for f in SIZE_FIELDS)
            if 2 * sum(sizes) + chain_total >= MAX_TOTAL_SIZE:
                raise InvalidProblem(
                    "weight_size: weights and gradients with the chain's sizes reach 2**62 "
                    "bytes; express sizes in a larger unit"
                )
            object.__setattr__(self, "weight_size", sizes)
        self._check_transfer_times()

    def _check_transfer_times(self) -> None:
        """Refuse copy engines so slow that a makespan overflows (bandwidth 0 is fine:
        no copy happens)."""
        chain = self.chain
        sizes = [*chain.in_size, *chain.saved_size, *(self.weight_size or ())]
        L = chain.length
        for name in ("offload", "prefetch"):
            engine = getattr(self.platform, name)
            times = [engine.time(v) for v in sizes]
            # every buffer copied at most once per node of a schedule tree
            total = scaled_sum(4 * (2 * L + 2), [t for t in times if math.isfinite(t)])
            if not math.isfinite(total):
                raise InvalidProblem(
                    f"platform.{name}: bandwidth {engine.bandwidth!r} B/s, latency "
                    f"{engine.latency!r} s: transfer times overflow a makespan"
                )

    def to_dict(self) -> dict:
        d = {"format": "schedir.offload_problem", "version": 1, "chain": self.chain.to_dict()}
        d["platform"] = self.platform.to_dict()
        if self.weight_size is not None:
            d["weight_size"] = list(self.weight_size)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> OffloadProblem:
        if not isinstance(d, dict) or d.get("format") != "schedir.offload_problem":
            raise InvalidProblem("expected a JSON object with format 'schedir.offload_problem'")
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        return cls(
            Chain.from_dict(d["chain"]), Platform.from_dict(d["platform"]), d.get("weight_size")
        )
