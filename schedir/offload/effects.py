"""What copy ops do to buffers, in program order: the one table of their rules, read by
the offload simulator (:mod:`schedir.offload.simulate`, which adds the copy engines'
timing) and by every executor that moves arrays between device and host memory
(``jax_exec.execute``).

A buffer is, on the device, ``"dev"`` (resident), ``"off"`` (resident and being copied
to the host by an ``Offload``) or ``"pre"`` (resident since a ``Prefetch`` started,
its copy from the host not yet waited for); and it may have a host copy. The rules
(docs/offload.md):

- ``Offload(b)``: b is ``"dev"`` and has no host copy -> ``"off"``, a host copy appears;
- ``Wait(b)`` after an ``Offload``: b leaves the device (its host copy stays);
- ``Prefetch(b)``: b is not on the device and has a host copy -> ``"pre"``: it counts on
  the device from now on;
- ``Wait(b)`` after a ``Prefetch``, or the first compute op that reads b: b is
  ``"dev"`` and its host copy goes (weights, ``w[k]``, keep theirs);
- ``Evict(b)``: b is ``"dev"`` and has a host copy -> it leaves the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedir.chain.ops import Buffer, buffer_name
from schedir.errors import InvalidSchedule
from schedir.offload.ops import Evict, Offload, Prefetch, Wait


@dataclass(frozen=True)
class CopyEffect:
    """One copy op's (or an implicit wait's) effect on its buffer.

    Attributes:
        buffer: the buffer.
        starts: ``"offload"`` or ``"prefetch"`` when a copy starts, else None.
        device_add: the buffer starts counting on the device (a ``Prefetch``).
        device_drop: the buffer leaves the device (``Wait`` after ``Offload``, ``Evict``).
        host_add: a host copy appears (``Offload``).
        host_drop: the host copy goes (a prefetch waited for).
        waits_for: the copy a ``Wait`` (or a compute op reading a prefetched buffer)
            waits for: ``"offload"``, ``"prefetch"`` or None.
    """

    buffer: Buffer
    starts: str | None = None
    device_add: bool = False
    device_drop: bool = False
    host_add: bool = False
    host_drop: bool = False
    waits_for: str | None = None


class CopyStates:
    """The program-order state of every buffer's copies (module docstring).

    ``device``: buffer -> ``"dev"``, ``"off"`` or ``"pre"`` (compute ops add and free
    buffers here too, through :meth:`add` and :meth:`free`); ``host``: buffers with a
    host copy; ``last``: buffer -> the direction of its last copy.
    """

    def __init__(self, device: dict[Buffer, str], host: set[Buffer] | None = None) -> None:
        self.device = dict(device)
        self.host = set(host or ())
        self.last: dict[Buffer, str] = {}
        self.waited: set[Buffer] = set()

    def effect(self, op: Offload | Prefetch | Wait | Evict) -> CopyEffect:
        """Apply a copy op; its :class:`CopyEffect`, or InvalidSchedule naming why not."""
        buf, name = op.key, buffer_name(op.key)
        state = self.device.get(buf)
        if isinstance(op, Offload):
            if state != "dev":
                why = {"off": "already being offloaded", "pre": "still being prefetched"}
                raise InvalidSchedule(f"{name} is {why.get(state, 'not resident')}")
            if buf in self.host:
                raise InvalidSchedule(f"{name} is already on the host (use Evict)")
            self.device[buf] = "off"
            self.host.add(buf)
            self.last[buf] = "offload"
            self.waited.discard(buf)
            return CopyEffect(buf, starts="offload", host_add=True)
        if isinstance(op, Prefetch):
            if state is not None:
                raise InvalidSchedule(f"{name} is already on the device")
            if buf not in self.host:
                raise InvalidSchedule(f"{name} is not on the host (Offload and Wait first)")
            self.device[buf] = "pre"
            self.last[buf] = "prefetch"
            self.waited.discard(buf)
            return CopyEffect(buf, starts="prefetch", device_add=True)
        if isinstance(op, Wait):
            direction = self.last.get(buf)
            if direction is None:
                raise InvalidSchedule(f"no copy of {name} was issued")
            if buf in self.waited:  # waiting again for a finished copy changes nothing
                return CopyEffect(buf, waits_for=direction)
            if direction == "offload":
                self.waited.add(buf)
                del self.device[buf]
                return CopyEffect(buf, device_drop=True, waits_for="offload")
            return self.settle(buf)
        if isinstance(op, Evict):
            if state != "dev" or buf not in self.host:
                raise InvalidSchedule(f"{name} needs a device copy and a host copy")
            del self.device[buf]
            return CopyEffect(buf, device_drop=True)
        raise InvalidSchedule(f"{op!r} is not a copy op")  # pragma: no cover

    def settle(self, buf: Buffer) -> CopyEffect:
        """A prefetch of ``buf`` waited for (``Wait``, or a compute op reading it)."""
        self.waited.add(buf)
        self.device[buf] = "dev"
        dropped = buf[0] != "w" and buf in self.host  # weights keep their host copy
        if dropped:
            self.host.discard(buf)
        return CopyEffect(buf, host_drop=dropped, waits_for="prefetch")

    def reads(self, buffers: tuple[Buffer, ...]) -> list[CopyEffect]:
        """A compute op reads ``buffers``: the prefetches among them are settled."""
        return [self.settle(b) for b in buffers if self.device.get(b) == "pre"]

    def add(self, buf: Buffer) -> None:
        """A compute op made ``buf``."""
        if buf in self.device:
            raise InvalidSchedule(f"{buffer_name(buf)} is already resident")
        if buf in self.host:
            raise InvalidSchedule(f"{buffer_name(buf)} is on the host already (prefetch it)")
        self.device[buf] = "dev"

    def free(self, buf: Buffer) -> None:
        """A compute op freed ``buf``."""
        if self.device[buf] == "off":
            raise InvalidSchedule(f"frees {buffer_name(buf)} while it is being offloaded")
        del self.device[buf]
