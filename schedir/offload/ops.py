"""Copy ops and offload schedules (docs/offload.md).

A schedule of an :class:`~schedir.offload.OffloadProblem` mixes the chain ops of
docs/semantics.md (their effects: :func:`schedir.chain.ops.effect`) with copy ops on
named buffers (``a[k]``, ``abar[k]``, ``d[k]``; with ``weight_size`` also ``w[k]`` and
``g[k]``): ``Offload``, ``Prefetch``, ``Wait``, ``Evict``; their timing and memory rules are
the offload simulator's (:mod:`schedir.offload.simulate`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from schedir.chain.ops import OP_TYPES, B, F_all, F_ck, F_n, Loss, parse_op
from schedir.chain.schedule import Schedule
from schedir.errors import InvalidSchedule

_BUF_RE = re.compile(r"^(a|abar|d|w|g)\[(\d+)\]$")
KINDS = ("a", "abar", "d", "w", "g")


def parse_buffer(text: str) -> tuple[str, int]:
    """``"abar[3]"`` -> ``("abar", 3)``; InvalidSchedule otherwise."""
    match = _BUF_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidSchedule(f"buffer {text!r}: expected one of {', '.join(KINDS)} as 'a[3]'")
    return match.group(1), int(match.group(2))


@dataclass(frozen=True)
class _CopyOp:
    buffer: str

    def __post_init__(self) -> None:
        buf = self.buffer
        if isinstance(buf, tuple):
            buf = f"{buf[0]}[{buf[1]}]"
        kind, k = parse_buffer(buf)
        object.__setattr__(self, "buffer", f"{kind}[{k}]")

    @property
    def key(self) -> tuple[str, int]:
        return parse_buffer(self.buffer)

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.buffer})"

    __repr__ = __str__


class Offload(_CopyOp):
    """Copy ``buffer`` device -> host; its device copy is freed when the copy ends."""


class Prefetch(_CopyOp):
    """Copy ``buffer`` host -> device; it occupies device memory from the copy's start."""


class Wait(_CopyOp):
    """The compute stream waits for the last copy of ``buffer`` to end."""


class Evict(_CopyOp):
    """Drop the device copy of a buffer that the host also holds (weights)."""


COPY_OP_TYPES: dict[str, type] = {
    "Offload": Offload,
    "Prefetch": Prefetch,
    "Wait": Wait,
    "Evict": Evict,
}
_COPY_RE = re.compile(r"^\s*(Offload|Prefetch|Wait|Evict)\(\s*([a-z]+\[\d+\])\s*\)\s*$")


def parse_offload_op(text: str):
    """Parse a chain op or a copy op from its printed form, e.g. ``"Offload(a[2])"``."""
    match = _COPY_RE.match(text) if isinstance(text, str) else None
    if match is not None:
        return COPY_OP_TYPES[match.group(1)](match.group(2))
    return parse_op(text)


@dataclass(frozen=True)
class OffloadSchedule(Schedule):
    """Chain ops and copy ops, with JSON format ``schedir.offload_schedule`` (version 1)."""

    FORMAT: ClassVar[str] = "schedir.offload_schedule"
    OPS: ClassVar[str] = "a chain or copy op"

    @staticmethod
    def parse_op(text: str):
        return parse_offload_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return type(op) in OP_TYPES.values() or type(op) in COPY_OP_TYPES.values()


def is_compute(op) -> bool:
    """Whether ``op`` is a chain op (it runs on the compute stream)."""
    return isinstance(op, F_ck | F_n | F_all | Loss | B)
