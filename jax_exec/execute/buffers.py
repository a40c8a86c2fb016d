"""Named buffers of arrays with their live bytes: the one buffer table of the op-by-op
interpreter (chain, copy and graph ops).

A buffer is named like the simulator's (``("a", c)``, ``("abar", c)``, ``("d", c)``,
``("node", i)``...) and maps keys (value ids, ``("new", j)`` residuals) to arrays. A
value read by several buffers keeps the same array in each; live bytes count every
distinct array once, as the problems' simulators count values. An array is deleted
(``Array.delete()``) once no buffer holds it, unless the runtime does not own it (the
caller's parameters and arguments, ``keep``). Arrays in host memory (``pinned_host``,
offloaded buffers) are counted apart from the device's. Arrays sharded over several
devices (a sharded model's) count per device: the live bytes are the fullest device's.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from jax_exec.program.placement import device_bytes

HOST = "pinned_host"


def in_host(array: Any) -> bool:
    return getattr(array.sharding, "memory_kind", None) == HOST


class Buffers:
    """Buffer name -> ``{key: array}``; live bytes over distinct arrays."""

    def __init__(self, keep: Iterable[int] = ()) -> None:
        self.table: dict[Hashable, dict] = {}
        self.keep = set(keep)  # ids of arrays the runtime does not own (never deleted)

    def arrays(self, name: Hashable) -> list:
        return list(self.table[name].values())

    def live(self) -> dict[int, Any]:
        return {id(a): a for buf in self.table.values() for a in buf.values()}

    def nbytes(self) -> int:
        """Live device bytes (host copies excluded); with arrays sharded over several
        devices, those of the device that holds the most (:meth:`device_nbytes`)."""
        arrays = [a for a in self.live().values() if not in_host(a)]
        if all(len(a.sharding.device_set) == 1 for a in arrays):
            return sum(int(a.nbytes) for a in arrays)
        return max(device_bytes(arrays).values())

    def device_nbytes(self) -> dict[Any, int]:
        """Live device bytes on each device (host copies excluded): the shards there."""
        return device_bytes(a for a in self.live().values() if not in_host(a))

    def host_bytes(self) -> int:
        """Live bytes in host memory."""
        return sum(int(a.nbytes) for a in self.live().values() if in_host(a))

    def _delete_unheld(self, arrays: Iterable[Any]) -> None:
        alive = self.live()
        for arr in arrays:
            if id(arr) not in alive and id(arr) not in self.keep:
                arr.delete()

    def drop(self, name: Hashable) -> None:
        """Remove buffer ``name``; delete its arrays that no other buffer holds."""
        self._delete_unheld(self.table.pop(name).values())

    def replace(self, name: Hashable, key: Any, array: Any) -> None:
        """Put ``array`` under ``key`` in buffer ``name`` (a copy in another memory);
        delete the array it replaces if no buffer holds it."""
        old = self.table[name][key]
        self.table[name][key] = array
        self._delete_unheld([old])

    def release(self, name: Hashable, key: Any) -> None:
        """Take ``key`` out of buffer ``name``; delete its array if no buffer holds it."""
        self._delete_unheld([self.table[name].pop(key)])

    def source(self, c: int) -> tuple[str, int]:
        """The buffer holding the values of cut ``c``: ``a[c]``, else ``abar[c]``."""
        for name in (("a", c), ("abar", c)):
            if name in self.table:
                return name
        raise RuntimeError(f"a[{c}] or abar[{c}] should be resident")  # pragma: no cover

    def clear(self) -> None:
        """Drop every buffer (what a step leaves: the caller holds the results)."""
        for name in list(self.table):
            self.drop(name)
