"""A schedule: an op sequence plus metadata, with a versioned JSON format.

:class:`Schedule` holds chain ops and is the base class of every kind's schedule
(``GraphSchedule``, ``OffloadSchedule``, ``PipelineSchedule``, ...): they override
how ops are parsed and checked. It lives in the chain kind, the kind every other one
builds on, so that the chain kind imports nothing above it; ``schedir.schedule`` and
``schedir.Schedule`` name the same class.

JSON format (version 1), readable without JAX::

    {"format": "schedir.schedule", "version": 1,
     "ops": ["F_ck(0)", "F_n(1)", ..., "Loss()", "B(1)", "B(0)"],
     "meta": {"method": "rotor", "budget": 1024, "solve_time": 0.01, "options": {}}}

Ops are written in their printed form and parsed by :func:`schedir.chain.ops.parse_op`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from schedir.chain.ops import OP_TYPES, parse_op
from schedir.errors import InvalidSchedule

FORMAT = "schedir.schedule"
VERSION = 1


@dataclass(frozen=True)
class Schedule:
    """An op sequence (``ops``) and a JSON-compatible ``meta`` dict.

    ``meta`` usually holds ``method``, ``budget`` (bytes), ``solve_time`` (seconds) and
    ``options``; it is normalized through JSON on construction so that
    ``Schedule.from_json(s.to_json()) == s`` always holds.

    Schedules of other problem kinds subclass this one and set ``FORMAT``, ``OPS`` (a
    description for errors), and override ``parse_op`` / ``is_op``. A kind whose ops
    are not one flat sequence (a pipeline: one op list per device) overrides
    :meth:`checked_ops` (normalize and check ``ops``), :meth:`ops_to_json` and
    ``__len__`` (the number of ops) instead.
    """

    ops: tuple
    meta: dict = field(default_factory=dict)

    FORMAT: ClassVar[str] = FORMAT
    OPS: ClassVar[str] = "a chain op"

    @staticmethod
    def parse_op(text: str):
        return parse_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return type(op) in OP_TYPES.values()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", self.checked_ops(self.ops))
        object.__setattr__(self, "meta", normalized_meta(self.meta))

    def checked_ops(self, ops) -> tuple:
        """``ops`` as a tuple of op objects (printed forms parsed); InvalidSchedule
        naming the first one that is not an op of this class."""
        ops = tuple(self.parse_op(op) if isinstance(op, str) else op for op in ops)
        for i, op in enumerate(ops):
            if not self.is_op(op):
                raise InvalidSchedule(f"op {i}: {op!r} is not {self.OPS}")
        return ops

    def ops_to_json(self) -> list:
        """The ``ops`` entry of the JSON form (printed ops)."""
        return [str(op) for op in self.ops]

    def __len__(self) -> int:
        """The number of ops."""
        return len(self.ops)

    def to_dict(self) -> dict:
        return {
            "format": self.FORMAT,
            "version": VERSION,
            "ops": self.ops_to_json(),
            "meta": self.meta,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        if not isinstance(d, dict):
            raise InvalidSchedule(f"expected a JSON object for a schedule, got {type(d).__name__}")
        if d.get("format") != cls.FORMAT:
            raise InvalidSchedule(f"format = {d.get('format')!r}: expected {cls.FORMAT!r}")
        if d.get("version") != VERSION:
            raise InvalidSchedule(f"version = {d.get('version')!r}: this library reads {VERSION}")
        if not isinstance(d.get("ops"), list):
            raise InvalidSchedule("schedule JSON lacks the list 'ops'")
        meta = d.get("meta")
        return cls(ops=tuple(d["ops"]), meta={} if meta is None else meta)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(json.loads(text))


def normalized_meta(meta) -> dict:
    """``meta`` through JSON (a copy), checked where readers rely on a type.

    ``budget`` is ``None`` or a non-negative whole number of bytes (readers compare
    it with peaks). Raises :class:`InvalidSchedule` naming the key and the value.
    """
    if not isinstance(meta, dict):
        raise InvalidSchedule(f"meta = {_short(meta)}: expected a JSON object")
    try:
        meta = json.loads(json.dumps(meta))
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidSchedule(f"meta is not JSON-serializable: {err}") from None
    budget = meta.get("budget")
    if budget is not None and (type(budget) is not int or budget < 0):
        raise InvalidSchedule(
            f"meta.budget = {_short(budget)}: expected a non-negative whole number of bytes"
        )
    return meta


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_ops(schedule_or_ops: Schedule | Iterable) -> tuple:
    """The op tuple of a schedule, or of a plain sequence of ops / op strings."""
    if isinstance(schedule_or_ops, Schedule):
        return schedule_or_ops.ops
    return Schedule(tuple(schedule_or_ops)).ops
