"""Named buffers of arrays with their live bytes: the one buffer table of the op-by-op
runtimes (chain, offload, graph)."""

from __future__ import annotations

from collections.abc import Hashable

import jax


class Buffers:
    """Buffer name -> its arrays; live bytes counted over distinct arrays.

    Arrays put with ``owned=False`` (the caller's inputs) are never deleted; any other
    array is deleted (``Array.delete()``) when the last buffer holding it is dropped.
    """

    def __init__(self) -> None:
        self.table: dict[Hashable, tuple[jax.Array, ...]] = {}
        self.nbytes: dict[int, int] = {}  # id -> bytes, read from each array once
        self.keep: set[int] = set()  # ids of arrays the runtime does not own

    def put(self, name: Hashable, arrays: tuple[jax.Array, ...], *, owned: bool = True) -> None:
        self.table[name] = arrays
        for arr in arrays:
            self.nbytes.setdefault(id(arr), int(arr.nbytes))
            if not owned:
                self.keep.add(id(arr))

    def bytes(self) -> int:
        live = {id(arr) for arrays in self.table.values() for arr in arrays}
        return sum(self.nbytes[i] for i in live)

    def drop(self, name: Hashable) -> None:
        arrays = self.table.pop(name)
        alive = {id(arr) for group in self.table.values() for arr in group}
        for arr in arrays:
            if id(arr) not in alive:
                self.nbytes.pop(id(arr), None)
                if id(arr) not in self.keep:
                    arr.delete()

    def clear(self) -> None:
        """Drop every buffer (what a schedule leaves: the caller holds the results)."""
        for name in list(self.table):
            self.drop(name)
