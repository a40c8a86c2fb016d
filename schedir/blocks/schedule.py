"""A block-chain schedule: chain ops (and copy ops) and the save option of each block.

JSON format (version 1)::

    {"format": "schedir.block_schedule", "version": 1,
     "ops": ["F_all(0)", "F_all(1)", "Loss()", "B(1)", "B(0)"],
     "options": [2, 0], "meta": {...}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.chain.schedule import VERSION, Schedule
from schedir.errors import InvalidSchedule
from schedir.offload.ops import OffloadSchedule, parse_offload_op


@dataclass(frozen=True)
class BlockSchedule(Schedule):
    """``ops`` (chain ops, copy ops allowed) and ``options``: per block of the chain,
    the index of the save option its recordings use; ``meta`` holds reporting facts."""

    options: tuple[int, ...] = ()

    FORMAT: ClassVar[str] = "schedir.block_schedule"
    OPS: ClassVar[str] = "a chain or copy op"
    parse_op = staticmethod(parse_offload_op)
    is_op = staticmethod(OffloadSchedule.is_op)

    def __post_init__(self) -> None:
        super().__post_init__()
        options = self.options
        if isinstance(options, str | bytes) or not hasattr(options, "__iter__"):
            raise InvalidSchedule(f"options = {options!r}: expected one option index per block")
        options = tuple(options)
        for k, o in enumerate(options):
            if isinstance(o, bool) or not isinstance(o, int) or o < 0:
                raise InvalidSchedule(f"options[{k}] = {o!r}: expected an option index (int >= 0)")
        object.__setattr__(self, "options", options)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "options": list(self.options)}

    @classmethod
    def from_dict(cls, d: dict) -> BlockSchedule:
        base = Schedule.from_dict.__func__(OffloadSchedule, {**d, "format": OffloadSchedule.FORMAT})
        if d.get("format") != cls.FORMAT:
            raise InvalidSchedule(f"format = {d.get('format')!r}: expected {cls.FORMAT!r}")
        if d.get("version") != VERSION:  # pragma: no cover - checked above
            raise InvalidSchedule(f"version = {d.get('version')!r}: this library reads {VERSION}")
        if not isinstance(d.get("options"), list):
            raise InvalidSchedule("block schedule JSON lacks the list 'options'")
        return cls(base.ops, base.meta, tuple(d["options"]))
