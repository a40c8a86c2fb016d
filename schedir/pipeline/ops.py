"""Multi-resource schedules: per-device op lists and the usual pipeline patterns.

Ops (each names a micro-batch or item ``mb``):

- ``Fwd(first, last, mb)``: forward of stages first..last-1 on this device's compute
  stream; needs a_first (the input if first == 0, else received), produces a_last.
- ``Bwd(first, last, mb, recompute)``: backward of those stages (with the loss when
  last == L); needs d_last (received, or the loss) and its own Fwd; produces d_first.
  ``recompute`` is extra time (seconds at speed 1) spent recomputing dropped
  activations (per-stage checkpointing).
- ``Send(kind, index, mb, peer)``: sends a_index (kind "a") or d_index ("d") of ``mb``
  to ``peer`` over link (this device, peer), a serial resource, in list order.
- ``Recv(kind, index, mb, peer)``: declares that this device receives it from ``peer``.

A :class:`PipelineSchedule` holds ``ops`` = ((device, (op, ...)), ...) and ``meta``.
When ``meta["periodic"]`` = K, the ops describe items 0..K-1 and item n + rK repeats
the pattern of item n (see :func:`expand`).
"""

from __future__ import annotations

import copy
import math
import numbers
import re
from dataclasses import dataclass
from typing import ClassVar

from schedir.chain.schedule import Schedule
from schedir.errors import InvalidSchedule
from schedir.pipeline.model import evaluate
from schedir.pipeline.problem import Mapping, PipelineProblem
from schedir.platform import LIMIT


def _index(op: object, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidSchedule(f"{type(op).__name__} {name} = {value!r}: expected an integer >= 0")


def _check_stages(op) -> None:
    for name in ("first", "last", "mb"):
        _index(op, name, getattr(op, name))
    if op.first >= op.last:
        raise InvalidSchedule(f"{op}: expected first < last")


def _check_message(op) -> None:
    if op.kind not in ("a", "d"):
        raise InvalidSchedule(f"{type(op).__name__} kind = {op.kind!r}: expected 'a' or 'd'")
    for name in ("index", "mb"):
        _index(op, name, getattr(op, name))
    if not isinstance(op.peer, str) or not op.peer:
        raise InvalidSchedule(f"{type(op).__name__} peer = {op.peer!r}: expected a device name")


@dataclass(frozen=True)
class Fwd:
    first: int
    last: int
    mb: int

    def __post_init__(self) -> None:
        _check_stages(self)

    def __str__(self) -> str:
        return f"F({self.first}:{self.last},{self.mb})"


@dataclass(frozen=True)
class Bwd:
    first: int
    last: int
    mb: int
    recompute: float = 0.0

    def __post_init__(self) -> None:
        _check_stages(self)
        r = self.recompute
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 <= r <= LIMIT:
            raise InvalidSchedule(f"{self}: recompute = {r!r}: expected seconds in [0, 1e100]")

    def __str__(self) -> str:
        extra = f",+{self.recompute!r}" if self.recompute else ""
        return f"B({self.first}:{self.last},{self.mb}{extra})"


@dataclass(frozen=True)
class Send:
    kind: str
    index: int
    mb: int
    peer: str

    def __post_init__(self) -> None:
        _check_message(self)

    def __str__(self) -> str:
        return f"Send({self.kind}{self.index},{self.mb},{self.peer})"


@dataclass(frozen=True)
class Recv:
    kind: str
    index: int
    mb: int
    peer: str

    def __post_init__(self) -> None:
        _check_message(self)

    def __str__(self) -> str:
        return f"Recv({self.kind}{self.index},{self.mb},{self.peer})"


PipelineOp = Fwd | Bwd | Send | Recv
_OP = re.compile(r"^(F|B|Send|Recv)\((.*)\)$")


def parse_pipeline_op(text: str) -> PipelineOp:
    """Inverse of ``str(op)``: ``F(0:3,5)``, ``B(0:3,5,+0.1)``, ``Send(a3,5,gpu1)``."""
    m = _OP.match(text.strip())
    if not m:
        raise InvalidSchedule(f"cannot parse pipeline op {text!r}")
    name, args = m.group(1), m.group(2).split(",")
    try:
        if name in ("F", "B"):
            first, last = (int(v) for v in args[0].split(":"))
            if name == "F":
                return Fwd(first, last, int(args[1]))
            extra = float(args[2].lstrip("+")) if len(args) > 2 else 0.0
            return Bwd(first, last, int(args[1]), extra)
        kind, index = args[0][0], int(args[0][1:])
        cls = Send if name == "Send" else Recv
        return cls(kind, index, int(args[1]), ",".join(args[2:]))
    except InvalidSchedule as err:
        raise InvalidSchedule(f"pipeline op {text!r}: {err}") from None
    except (ValueError, IndexError):
        raise InvalidSchedule(f"cannot parse pipeline op {text!r}") from None


Data = tuple[str, str, int, int]  # (device, "a" | "d", stage index, item): a_k or d_k of item mb


@dataclass(frozen=True)
class Effect:
    """What one pipeline op does (the module docstring's rules, written once).

    Attributes:
        resource: ``("compute", device)`` for Fwd / Bwd, ``("link", device, peer)`` for
            Send (a serial resource), ``()`` for Recv (a declaration: it runs nothing).
        reads: data the op waits for on its device: ``(device, "a", first, mb)`` for a
            Fwd with first > 0 (a Fwd with first == 0 reads the item's input, released
            at its arrival time), ``(device, "d", last, mb)`` for a Bwd with last < L,
            what a Send sends; for a Recv, what it expects to arrive.
        adds: data the op makes available: a_last (Fwd) or d_first (Bwd) on its
            device, the sent data on the peer (Send).
        stash: the forward whose stash a Bwd reads, ``(device, first, last, mb)``.
        work: compute seconds at speed 1 (Fwd: forward times; Bwd: backward times,
            plus ``recompute``, plus the loss when last == L); 0 for messages.
        nbytes: bytes a Send carries (x_index); 0 otherwise.
    """

    resource: tuple
    reads: tuple[Data, ...]
    adds: tuple[Data, ...]
    stash: tuple[str, int, int, int] | None
    work: float
    nbytes: int


def effect(problem: PipelineProblem, device: str, op: PipelineOp) -> Effect:
    """The :class:`Effect` of ``op`` in the list of ``device``: the rules of the module
    docstring, read by the simulator and by the multi-device executors.

    Raises ``InvalidSchedule`` when the op's stages (or a message's index) are out of
    range 0..L.

    >>> from schedir import Chain, Device, Platform, PipelineProblem
    >>> c = Chain.from_rotor([1.0, 2.0], [1.0, 1.0, 0.5], [8, 4, 2], [0, 8, 4], [0, 0],
    ...                      [0, 0, 0])
    >>> pb = PipelineProblem(c, (1, 1), Platform.fully_connected(
    ...     [Device("g0", 1.0, None), Device("g1", 1.0, None)], 4.0), training=True)
    >>> effect(pb, "g1", Bwd(1, 2, 0))
    Effect(resource=('compute', 'g1'), reads=(), adds=(('g1', 'd', 1, 0),), \
stash=('g1', 1, 2, 0), work=1.5, nbytes=0)
    >>> effect(pb, "g0", Send("a", 1, 0, "g1")).adds
    (('g1', 'a', 1, 0),)
    """
    chain, L = problem.chain, problem.length
    if isinstance(op, Send | Recv) and op.index > L:
        raise InvalidSchedule(f"index {op.index} out of range 0..{L}")
    if isinstance(op, Recv):
        return Effect((), ((device, op.kind, op.index, op.mb),), (), None, 0.0, 0)
    if isinstance(op, Send):
        held, sent = (device, op.kind, op.index, op.mb), (op.peer, op.kind, op.index, op.mb)
        nbytes = chain.in_size[op.index]
        return Effect(("link", device, op.peer), (held,), (sent,), None, 0.0, nbytes)
    if not isinstance(op, Fwd | Bwd):
        raise InvalidSchedule(f"{op!r} is not a pipeline op")
    if not 0 <= op.first < op.last <= L:
        raise InvalidSchedule(f"stages out of range 0..{L}")
    if isinstance(op, Fwd):
        reads = ((device, "a", op.first, op.mb),) if op.first > 0 else ()
        work = sum(chain.fwd_time[op.first : op.last])
        return Effect(("compute", device), reads, ((device, "a", op.last, op.mb),), None, work, 0)
    work = sum(chain.bwd_time[op.first : op.last]) + op.recompute
    if op.last == L:
        work += chain.fwd_time[L] + chain.bwd_time[L]
    reads = ((device, "d", op.last, op.mb),) if op.last < L else ()
    stash = (device, op.first, op.last, op.mb)
    return Effect(("compute", device), reads, ((device, "d", op.first, op.mb),), stash, work, 0)


@dataclass(frozen=True)
class PipelineSchedule(Schedule):
    """Per-device op lists and JSON-compatible metadata (see the module docstring).

    ``ops`` = ((device name, (op, ...)), ...); ``len(schedule)`` counts the ops of
    every device. JSON format ``schedir.pipeline_schedule`` (version 1; a missing
    version reads as 1)::

        {"format": "schedir.pipeline_schedule", "version": 1,
         "ops": [["gpu0", ["F(0:2,0)", "Send(a2,0,gpu1)"]], ["gpu1", [...]]], "meta": {}}
    """

    FORMAT: ClassVar[str] = "schedir.pipeline_schedule"
    OPS: ClassVar[str] = "a pipeline op (Fwd, Bwd, Send, Recv)"

    @staticmethod
    def parse_op(text: str):
        return parse_pipeline_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return isinstance(op, Fwd | Bwd | Send | Recv)

    def checked_ops(self, ops) -> tuple:
        lists = []
        for k, entry in enumerate(ops):
            if (
                not isinstance(entry, list | tuple)
                or len(entry) != 2
                or not isinstance(entry[0], str)
                or isinstance(entry[1], str)
                or not isinstance(entry[1], list | tuple)
            ):
                raise InvalidSchedule(f"ops[{k}]: expected [device name, [op, ...]]")
            dev, dev_ops = entry
            dev_ops = tuple(self.parse_op(o) if isinstance(o, str) else o for o in dev_ops)
            for o in dev_ops:
                if not self.is_op(o):
                    raise InvalidSchedule(f"device {dev}: {o!r} is not a pipeline op")
            lists.append((str(dev), dev_ops))
        return tuple(lists)

    def ops_to_json(self) -> list:
        return [[dev, [str(o) for o in ops]] for dev, ops in self.ops]

    def __len__(self) -> int:
        return sum(len(ops) for _, ops in self.ops)

    @property
    def mapping(self) -> Mapping | None:
        m = self.meta.get("mapping")
        return None if m is None else Mapping.from_dict(m)

    @classmethod
    def from_dict(cls, d: dict) -> PipelineSchedule:
        if isinstance(d, dict) and "version" not in d:
            d = {**d, "version": 1}
        if isinstance(d, dict) and d.get("format") == cls.FORMAT:
            ops = d.get("ops")
            if not isinstance(ops, list):
                raise InvalidSchedule(f"ops = {ops!r}: expected a list of [device, [op, ...]]")
        return super().from_dict(d)


def _shift(op: PipelineOp, offset: int) -> PipelineOp:
    """``op`` for item mb + offset (offset >= 0: still a valid op, not checked again)."""
    moved = copy.copy(op)
    object.__setattr__(moved, "mb", op.mb + offset)
    return moved


def expand(schedule: PipelineSchedule, items: int) -> PipelineSchedule:
    """The op lists of ``items`` items from a periodic pattern (a no-op otherwise)."""
    K = schedule.meta.get("periodic")
    if not K:
        return schedule
    reps = math.ceil(items / K)
    lists = []
    for dev, ops in schedule.ops:
        out = [_shift(o, r * K) for r in range(reps) for o in ops]
        lists.append((dev, tuple(o for o in out if o.mb < items)))
    meta = {k: v for k, v in schedule.meta.items() if k != "periodic"}
    return PipelineSchedule(tuple(lists), {**meta, "items": items})


def inference_pattern(problem: PipelineProblem, mapping: Mapping) -> PipelineSchedule:
    """The periodic round-robin pattern of an inference mapping (K = lcm of |R|)."""
    mapping.check(problem)
    ivs = mapping.intervals
    K = math.lcm(*(len(iv.devices) for iv in ivs))
    lists: dict[str, list] = {u: [] for iv in ivs for u in iv.devices}
    for n in range(K):
        for g, iv in enumerate(ivs):
            u = iv.devices[n % len(iv.devices)]
            if g > 0:
                prev = ivs[g - 1].devices
                lists[u].append(Recv("a", iv.first, n, prev[n % len(prev)]))
            lists[u].append(Fwd(iv.first, iv.last, n))
            if g + 1 < len(ivs):
                nxt = ivs[g + 1].devices
                lists[u].append(Send("a", iv.last, n, nxt[n % len(nxt)]))
    rep = evaluate(problem, mapping)
    meta = {"mapping": mapping.to_dict(), "periodic": K, "kind": "inference",
            "period": rep.period, "latency": rep.latency}  # fmt: skip
    return PipelineSchedule(tuple((u, tuple(v)) for u, v in lists.items()), meta)


def _stage_devices(problem: PipelineProblem, mapping: Mapping) -> list[str]:
    mapping.check(problem)
    if any(len(iv.devices) != 1 for iv in mapping.intervals):
        raise InvalidSchedule("training pipelines take one device per interval (no replication)")
    return [iv.devices[0] for iv in mapping.intervals]


def _training_ops(problem, mapping, order, recompute) -> PipelineSchedule:
    devs = _stage_devices(problem, mapping)
    ivs, P = mapping.intervals, len(mapping.intervals)
    recompute = recompute or [0.0] * P
    lists = []
    for p, (iv, u) in enumerate(zip(ivs, devs, strict=True)):
        ops: list = []
        for kind, mb in order(p, P):
            if kind == "F":
                if p > 0:
                    ops.append(Recv("a", iv.first, mb, devs[p - 1]))
                ops.append(Fwd(iv.first, iv.last, mb))
                if p + 1 < P:
                    ops.append(Send("a", iv.last, mb, devs[p + 1]))
            else:
                if p + 1 < P:
                    ops.append(Recv("d", iv.last, mb, devs[p + 1]))
                ops.append(Bwd(iv.first, iv.last, mb, recompute[p]))
                if p > 0:
                    ops.append(Send("d", iv.first, mb, devs[p - 1]))
        lists.append((u, tuple(ops)))
    return PipelineSchedule(tuple(lists), {"mapping": mapping.to_dict(), "kind": "training"})


def gpipe_ops(
    problem: PipelineProblem, mapping: Mapping, recompute: list[float] | None = None
) -> PipelineSchedule:
    """GPipe (Huang et al., NeurIPS 2019): all forwards, then all backwards (reversed)."""
    m = problem.microbatches

    def order(p: int, P: int):
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]

    s = _training_ops(problem, mapping, order, recompute)
    return PipelineSchedule(s.ops, {**s.meta, "pattern": "gpipe"})


def one_f_one_b_order(p: int, P: int, m: int) -> list[tuple[str, int]]:
    """1F1B order of stage p of P (PipeDream-Flush, Narayanan et al., SC 2021): P-p-1
    warm-up forwards, then alternate one forward and one backward, then drain; at most
    P - p micro-batches are in flight on stage p."""
    warm = min(P - p - 1, m)
    seq = [("F", i) for i in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            seq.append(("F", f))
            f += 1
        seq.append(("B", b))
    return seq


def one_f_one_b_ops(
    problem: PipelineProblem, mapping: Mapping, recompute: list[float] | None = None
) -> PipelineSchedule:
    """The 1F1B schedule of ``problem.microbatches`` micro-batches on ``mapping``."""
    m = problem.microbatches
    s = _training_ops(problem, mapping, lambda p, P: one_f_one_b_order(p, P, m), recompute)
    return PipelineSchedule(s.ops, {**s.meta, "pattern": "1f1b"})
