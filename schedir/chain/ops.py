"""Operations of a chain schedule (docs/semantics.md, the op table).

Each op is a small frozen, hashable value that prints as ``F_ck(3)`` and parses back
with :func:`parse_op`. Memory semantics live in :mod:`schedir.simulate`.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

from schedir.errors import InvalidSchedule


@dataclass(frozen=True)
class _StageOp:
    index: int

    def __post_init__(self) -> None:
        index = self.index
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
            raise InvalidSchedule(f"{type(self).__name__}: index = {index!r}, expected int >= 0")
        object.__setattr__(self, "index", int(index))

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.index})"

    __repr__ = __str__


class F_ck(_StageOp):
    """Forward of stage k keeping its input: adds ``a[k+1]``."""


class F_n(_StageOp):
    """Forward of stage k dropping its input: adds ``a[k+1]``, frees ``a[k]`` else ``abar[k]``."""


class F_all(_StageOp):
    """Recording forward of stage k: adds ``abar[k+1]`` (output and residuals)."""


class B(_StageOp):
    """Backward of stage k: adds ``d[k]``, consumes ``d[k+1]`` and ``abar[k+1]``, frees ``a[k]``."""


@dataclass(frozen=True)
class Loss:
    """Loss and its gradient: adds ``d[L]``, frees ``a[L]`` if present (``abar[L]`` stays)."""

    def __str__(self) -> str:
        return "Loss()"

    __repr__ = __str__


ChainOp = F_ck | F_n | F_all | Loss | B
OP_TYPES: dict[str, type] = {"F_ck": F_ck, "F_n": F_n, "F_all": F_all, "B": B, "Loss": Loss}
_OP_RE = re.compile(r"^\s*(\w+)\(\s*(\d*)\s*\)\s*$")


def parse_op(text: str) -> ChainOp:
    """Parse the printed form of an op.

    >>> parse_op("F_ck(3)"), parse_op("Loss()")
    (F_ck(3), Loss())
    """
    match = _OP_RE.match(text) if isinstance(text, str) else None
    if match is None or match.group(1) not in OP_TYPES:
        raise InvalidSchedule(
            f"cannot parse op {text!r}: expected one of {', '.join(OP_TYPES)} as e.g. 'F_ck(3)'"
        )
    name, arg = match.groups()
    if name == "Loss":
        if arg:
            raise InvalidSchedule(f"cannot parse op {text!r}: Loss takes no index")
        return Loss()
    if not arg:
        raise InvalidSchedule(f"cannot parse op {text!r}: {name} needs a stage index")
    return OP_TYPES[name](int(arg))
