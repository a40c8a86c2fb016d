"""Operations of a chain schedule (docs/semantics.md, the op table).

Each op is a small frozen, hashable value that prints as ``F_ck(3)`` and parses back
with :func:`parse_op`. What each op reads, adds and frees is :func:`effect`: the one
statement of the op table, read by the chain simulator, the offload simulator and the
executors.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from schedir.errors import InvalidSchedule

if TYPE_CHECKING:
    from schedir.chain.problem import Chain


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


def store_all_ops(length: int) -> tuple[ChainOp, ...]:
    """The schedule of a chain of ``length`` stages that records every stage once and
    recomputes nothing: ``F_all(0..L-1) Loss B(L-1..0)``."""
    return (*(F_all(k) for k in range(length)), Loss(),
            *(B(k) for k in reversed(range(length))))  # fmt: skip


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


Buffer = tuple[str, int]  # ("a" | "abar" | "d", k): a[k], abar[k], d[k]


def buffer_name(buf: Buffer) -> str:
    """Printed form of a buffer, e.g. ``abar[3]``."""
    return f"{buf[0]}[{buf[1]}]"


class MissingBuffer(InvalidSchedule):
    """An op's input is not resident. ``wanted``: the buffers any one of which would do
    (``a[k]`` or ``abar[k]`` for a stage input; one buffer otherwise)."""

    def __init__(self, op, wanted: tuple[Buffer, ...]):
        self.op, self.wanted = op, wanted
        if len(wanted) == 1:
            why = f"needs {buffer_name(wanted[0])}, which is not resident"
        else:
            names = " or ".join(buffer_name(b) for b in wanted)
            why = f"needs {names}, neither is resident"
        super().__init__(why)


class Effect(NamedTuple):
    """What one chain op does (docs/semantics.md, the op table). Immutable; a
    NamedTuple rather than a frozen dataclass because simulators build one per op.

    Attributes:
        reads: buffers the op reads (all resident when it starts).
        adds: buffers it makes resident (its output).
        frees: buffers it frees when it ends (a subset of ``reads``).
        time: its duration, seconds.
        tmp: temporary bytes it needs while it runs, on top of the resident buffers
            and its output.
    """

    reads: tuple[Buffer, ...]
    adds: tuple[Buffer, ...]
    frees: tuple[Buffer, ...]
    time: float
    tmp: int


_FORWARDS = frozenset({F_ck, F_n, F_all})


def effect(chain: Chain, op: ChainOp, resident: Container[Buffer]) -> Effect:
    """The :class:`Effect` of ``op`` on ``chain`` when ``resident`` buffers are held.

    The op table of docs/semantics.md, written once. The input of stage k is ``a[k]``
    when resident, else ``abar[k]`` (the recorded form holds a_k too):

    - ``F_ck(k)``: reads it, adds ``a[k+1]``; ``F_n(k)``: also frees it;
      ``F_all(k)``: adds ``abar[k+1]`` (output and residuals). Temporaries
      ``fwd_tmp[k]``, time ``fwd_time[k]``.
    - ``Loss()``: reads the input of stage L, adds ``d[L]``, frees ``a[L]`` when that
      was the input (``abar[L]`` stays for ``B(L-1)``). Temporaries ``bwd_tmp[L]``,
      time ``fwd_time[L] + bwd_time[L]``.
    - ``B(k)``: reads ``d[k+1]``, ``abar[k+1]`` and the input of stage k, adds
      ``d[k]``; frees ``d[k+1]``, ``abar[k+1]`` and ``a[k]`` when that was the input.
      Temporaries ``bwd_tmp[k]``, time ``bwd_time[k]``.

    Whether an output is already resident, and whether each backward runs once, is
    the caller's state (a simulator or an executor); this function only reads
    ``resident``. Raises :class:`MissingBuffer` (an ``InvalidSchedule``) when an input
    is not resident, ``InvalidSchedule`` when the op is not a chain op or its stage
    is out of range.

    >>> from schedir import Chain
    >>> c = Chain.from_rotor([1.0, 1.0], [2.0, 2.0, 0.5], [4, 8, 2], [0, 12, 6], [0, 0],
    ...                      [0, 0, 0])
    >>> effect(c, F_n(0), {("a", 0)})
    Effect(reads=(('a', 0),), adds=(('a', 1),), frees=(('a', 0),), time=1.0, tmp=0)
    >>> e = effect(c, B(0), {("a", 0), ("abar", 1), ("d", 1)})
    >>> e.adds, e.frees
    ((('d', 0),), (('a', 0), ('d', 1), ('abar', 1)))
    """
    reads, adds, frees = buffer_moves(op, len(chain.fwd_time) - 1, resident)
    cls = type(op)
    if cls is Loss:
        time = chain.fwd_time[-1] + chain.bwd_time[-1]
        return Effect(reads, adds, frees, time, chain.bwd_tmp[-1])
    k = op.index
    if cls is B:
        return Effect(reads, adds, frees, chain.bwd_time[k], chain.bwd_tmp[k])
    return Effect(reads, adds, frees, chain.fwd_time[k], chain.fwd_tmp[k])


def buffer_moves(
    op: ChainOp, length: int, resident: Container[Buffer]
) -> tuple[tuple[Buffer, ...], tuple[Buffer, ...], tuple[Buffer, ...]]:
    """``(reads, adds, frees)`` of ``op`` on a chain of ``length`` stages: the buffer
    part of :func:`effect`, for models that cost the ops their own way (the block
    chains of ``schedir.blocks``). Same rules and errors as :func:`effect`.

    >>> buffer_moves(F_all(1), 3, {("abar", 1)})
    ((('abar', 1),), (('abar', 2),), ())
    """
    cls = type(op)
    L = length
    if cls is Loss:
        k = L
    elif cls is B or cls in _FORWARDS:
        k = op.index
        if k >= L:
            raise InvalidSchedule(f"stage {k} out of range 0..{L - 1} (the loss runs as Loss())")
    else:
        raise InvalidSchedule(f"{op!r} is not a chain op")
    if cls is B:
        d, abar = ("d", k + 1), ("abar", k + 1)
        for buf in (d, abar):
            if buf not in resident:
                raise MissingBuffer(op, (buf,))
    a = ("a", k)
    if a in resident:
        src, frees_src = a, (a,)
    else:
        src, frees_src = ("abar", k), ()
        if src not in resident:
            raise MissingBuffer(op, (a, src))
    if cls is B:
        return (d, abar, src), (("d", k),), (*frees_src, d, abar)
    if cls is Loss:
        return (src,), (("d", L),), frees_src
    out = ("abar", k + 1) if cls is F_all else ("a", k + 1)
    return (src,), (out,), (src,) if cls is F_n else ()


def op_time(chain: Chain, op: ChainOp) -> float:
    """Time of one op on ``chain``, seconds (the ``time`` of its :func:`effect`)."""
    if isinstance(op, Loss):
        return chain.fwd_time[-1] + chain.bwd_time[-1]
    if isinstance(op, B):
        return chain.bwd_time[op.index]
    return chain.fwd_time[op.index]


def backward_index(chain: Chain, op: ChainOp) -> int | None:
    """The backward ``op`` completes: k for ``B(k)``, L for ``Loss()``, None for a forward."""
    if isinstance(op, Loss):
        return chain.length
    return op.index if isinstance(op, B) else None


def check_complete_step(done: list[bool], n_ops: int) -> None:
    """Raise ``InvalidSchedule`` when a sequence of ``n_ops`` ops is not a complete
    training step: ``done[k]`` says whether ``B(k)`` ran, ``done[L]`` whether ``Loss()``
    ran."""
    L = len(done) - 1
    missing = [f"B({k})" for k in range(L - 1, -1, -1) if not done[k]]
    if not done[L]:
        missing.insert(0, "Loss()")
    if missing:
        raise InvalidSchedule(
            f"op {n_ops} (after the last op): incomplete training step, "
            f"{', '.join(missing)} never ran so d[0] is not computed"
        )
