"""Multi-resource schedules: per-device op lists and the usual pipeline patterns.

Ops (each names a micro-batch or item ``mb``; a device may run several chunks
[first, last) of stages, the *virtual stages* of interleaved and V-shaped schedules):

- ``Fwd(first, last, mb)``: forward of stages first..last-1 on this device's compute
  stream; needs a_first (the input if first == 0, else received or made here by the
  previous chunk), produces a_last.
- ``Bwd(first, last, mb, recompute, part)``: backward of those stages (with the loss
  when last == L); needs d_last (received, made here, or the loss) and its own Fwd;
  produces d_first. ``recompute`` is extra time (seconds at speed 1) spent recomputing
  dropped activations (per-stage checkpointing). ``part="full"`` (printed ``B``): the
  input and the weight gradients together; ``part="input"`` (printed ``Bi``): the
  input gradient only (zero-bubble's B), its weight gradient left to a ``Wgt``.
- ``Wgt(first, last, mb)`` (printed ``W``): the weight gradient of that chunk for that
  micro-batch; needs its ``Bwd(part="input")`` done on the same device.
- ``Send(kind, index, mb, peer)``: sends a_index (kind "a") or d_index ("d") of ``mb``
  to ``peer`` over link (this device, peer), a serial resource, in list order.
- ``Recv(kind, index, mb, peer)``: declares that this device receives it from ``peer``.

Times and memory of every op are :func:`effect` (the rules, written once; the
simulator and the executors read them). The schedule holding the ops per device is
:class:`schedir.pipeline.schedule.PipelineSchedule`.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

from schedir.errors import InvalidSchedule
from schedir.pipeline.problem import PipelineProblem, working_set
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
    """Backward of stages [first, last) for micro-batch ``mb``; ``part`` "full" (input
    and weight gradients) or "input" (the input gradient only, see :class:`Wgt`)."""

    first: int
    last: int
    mb: int
    recompute: float = 0.0
    part: str = "full"

    def __post_init__(self) -> None:
        _check_stages(self)
        if self.part not in PARTS:
            raise InvalidSchedule(
                f"Bwd part = {self.part!r}: expected 'full' (input and weight gradients) "
                "or 'input' (the input gradient only)"
            )
        r = self.recompute
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 <= r <= LIMIT:
            raise InvalidSchedule(f"{self}: recompute = {r!r}: expected seconds in [0, 1e100]")

    def __str__(self) -> str:
        extra = f",+{self.recompute!r}" if self.recompute else ""
        name = "B" if self.part == "full" else "Bi"
        return f"{name}({self.first}:{self.last},{self.mb}{extra})"


PARTS = ("full", "input")


@dataclass(frozen=True)
class Wgt:
    """The weight gradient of stages [first, last) for micro-batch ``mb`` (zero-bubble's
    W): needs ``Bwd(first, last, mb, part="input")`` done on the same device."""

    first: int
    last: int
    mb: int

    def __post_init__(self) -> None:
        _check_stages(self)

    def __str__(self) -> str:
        return f"W({self.first}:{self.last},{self.mb})"


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


PipelineOp = Fwd | Bwd | Wgt | Send | Recv
_OP = re.compile(r"^(F|Bi|B|W|Send|Recv)\((.*)\)$")


def parse_pipeline_op(text: str) -> PipelineOp:
    """Inverse of ``str(op)``: ``F(0:3,5)``, ``B(0:3,5,+0.1)``, ``Bi(0:3,5)``,
    ``W(0:3,5)``, ``Send(a3,5,gpu1)``."""
    m = _OP.match(text.strip())
    if not m:
        raise InvalidSchedule(f"cannot parse pipeline op {text!r}")
    name, args = m.group(1), m.group(2).split(",")
    try:
        if name in ("F", "B", "Bi", "W"):
            first, last = (int(v) for v in args[0].split(":"))
            if name in ("F", "W"):
                if len(args) != 2:
                    raise ValueError(text)
                return (Fwd if name == "F" else Wgt)(first, last, int(args[1]))
            extra = float(args[2].lstrip("+")) if len(args) > 2 else 0.0
            part = "full" if name == "B" else "input"
            return Bwd(first, last, int(args[1]), extra, part)
        kind, index = args[0][0], int(args[0][1:])
        cls = Send if name == "Send" else Recv
        return cls(kind, index, int(args[1]), ",".join(args[2:]))
    except InvalidSchedule as err:
        raise InvalidSchedule(f"pipeline op {text!r}: {err}") from None
    except (ValueError, IndexError):
        raise InvalidSchedule(f"cannot parse pipeline op {text!r}") from None


# (device, kind, index, mb): what lives on a device for one micro-batch. kind "a" / "d":
# a_index / d_index (index: a stage); "s": the stash of chunk index = (first, last) from
# its Fwd; "w": what its weight gradient still needs after Bwd(part="input").
Data = tuple[str, str, int | tuple[int, int], int]
Buffer = tuple[Data, int]  # a buffer and its bytes


@dataclass(frozen=True)
class Effect:
    """What one pipeline op does (the module docstring's rules, written once).

    Attributes:
        resource: ``("compute", device)`` for Fwd / Bwd / Wgt, ``("link", device,
            peer)`` for Send (a serial resource), ``()`` for Recv (a declaration).
        reads: data the op waits for: a_first for a Fwd with first > 0 (a Fwd with
            first == 0 reads the item's input, released at its arrival time), d_last
            for a Bwd with last < L, the stash of its Fwd for a Bwd, the "w" data of its
            input part for a Wgt, what a Send sends; for a Recv, what it expects.
        adds: data the op makes available when it ends: a_last (Fwd) and its stash
            ("s"), d_first (Bwd) and, for an input part, its "w" data; the sent data on
            the peer (Send).
        work: compute seconds at speed 1 (Fwd: forward times; Bwd: backward times (the
            input part: less the weight-gradient share), plus ``recompute``, plus the
            loss when last == L; Wgt: the weight-gradient share); 0 for messages.
        nbytes: bytes a Send carries (x_index); 0 otherwise.
        allocs: buffers allocated when the op starts, each on its own device (a
            Send's receive buffer is on the peer, from the transfer's start).
        allocs_end: buffers allocated when the op ends (a Bwd's "w" data, an output
            made inside a footprint).
        releases: buffers this op releases when it ends.
        releases_start: buffers this op releases when it starts (inside a footprint).
        temp: bytes live on the device while the op runs (its working set).

    Memory rule (the simulator's, and what an executor holds): a buffer lives from
    its allocation until the last op that releases it has released it; one that no
    op releases is freed when the op that allocated it ends.
    """

    resource: tuple
    reads: tuple[Data, ...]
    adds: tuple[Data, ...]
    work: float
    nbytes: int
    allocs: tuple[Buffer, ...] = ()
    allocs_end: tuple[Buffer, ...] = ()
    releases: tuple[Data, ...] = ()
    releases_start: tuple[Data, ...] = ()
    temp: int = 0


def _output_share(problem: PipelineProblem, j: int) -> int:
    """Bytes of chunk [i, j)'s stash that are its output a_j itself (j < L): the chain's
    ``saved_size[j-1]`` (the abar of stage j-1) holds a_j, the buffer the forward also
    sends, so it is counted once, as the output."""
    if j >= problem.length:
        return 0
    return min(problem.chain.in_size[j], problem.chain.saved_size[j - 1])


def stash_bytes(problem: PipelineProblem, first: int, last: int) -> int:
    """Bytes of the stash of chunk [first, last) (no footprint): its stages' saved
    sizes less its output (counted as the output buffer, which then lives until the
    backward too, :func:`_output_share`), plus the target on the chunk with the loss."""
    saved = sum(problem.chain.saved_size[first:last]) - _output_share(problem, last)
    return saved + (problem.target_bytes if last == problem.length else 0)


def wgrad_hold(problem: PipelineProblem, first: int, last: int, held: int) -> int:
    """Bytes the weight gradient of chunk [first, last) holds after its input part:
    ``sum(problem.wgrad_bytes[first:last])``, or ``held`` (what the input part would
    have freed) when the problem does not give them."""
    if problem.wgrad_bytes is None:
        return held
    return sum(problem.wgrad_bytes[first:last])


def effect(
    problem: PipelineProblem,
    device: str,
    op: PipelineOp,
    *,
    training: bool | None = None,
    footprint: int | None = None,
    held: int | None = None,
) -> Effect:
    """The :class:`Effect` of ``op`` in the list of ``device``: the rules of the module
    docstring, read by the simulator and by the multi-device executors.

    ``training`` (default ``problem.training``): whether a Fwd keeps what its backward
    needs. ``footprint``: bytes per micro-batch that a plan reserves for the op's chunk
    (its ``ChunkPlan.footprint``: e.g. a rotor plan's peak, which covers the chunk's
    input, its activations, the incoming gradient and the temporaries) from its Fwd's
    start to its backward's end, in place of the chunk's own accounting below.
    ``held`` (its ``ChunkPlan.held``, at most the footprint): the part of it held
    between its forward and its backward, the rest being its ops' working set.

    Memory (bytes, x_k = ``in_size[k]``; docs/pipelines.md "Lifetimes"):

    - Fwd(i, j): its output a_j (x_j, j < L) from its start until the last Send of it
      (or its local consumer) releases it, in training not before its own backward;
      x_0 when i == 0 from its start; its working set while it runs; in training its
      stash (:func:`stash_bytes`: ``sum(saved_size[i:j])`` less the output, which the
      last stage's abar holds and which is counted once, as a_j; plus
      ``target_bytes`` on the chunk with the loss) from its start, and it keeps its
      input until its backward. In inference it releases its input when it ends.
    - Bwd(i, j): d_i (x_i, i > 0) from its start until sent; its working set; when it
      ends it releases its stash, its input a_i, its output a_j and the incoming d_j.
      The input part (``part="input"``) with ``wgrad_bytes`` releases them too and
      allocates the "w" data (``sum(wgrad_bytes[i:j])``), which its Wgt releases;
      without ``wgrad_bytes`` it releases nothing and its Wgt releases them (a split
      backward frees nothing early).
    - Send: the receive buffer on the peer from the transfer's start until its consumer
      releases it; the sender's copy is released when the send ends.
    - Inside a footprint F: the Fwd allocates F and releases its input when it starts;
      the backward releases the incoming gradient when it starts and F when it ends;
      d_i is allocated when it ends (until sent). With ``held`` H, the Fwd allocates H
      and F - H is the working set of the Fwd and of the backward; an input part
      without ``wgrad_bytes`` keeps H and the incoming gradient (x_j, j < L) for its
      Wgt, whose working set is then F - H.

    Raises ``InvalidSchedule`` when the op's stages (or a message's index) are out of
    range 0..L.

    >>> from schedir import Chain, Device, Platform, PipelineProblem
    >>> c = Chain.from_rotor([1.0, 2.0], [1.0, 1.0, 0.5], [8, 4, 2], [0, 8, 4], [0, 0],
    ...                      [0, 0, 0])
    >>> pb = PipelineProblem(c, (1, 1), Platform.fully_connected(
    ...     [Device("g0", 1.0, None), Device("g1", 1.0, None)], 4.0), training=True,
    ...     wgrad_fraction=(0.5, 0.5), wgrad_bytes=(8, 6))
    >>> e = effect(pb, "g1", Bwd(1, 2, 0, part="input"))
    >>> e.work, e.reads, e.allocs_end
    (1.0, (('g1', 's', (1, 2), 0),), ((('g1', 'w', (1, 2), 0), 6),))
    >>> effect(pb, "g1", Wgt(1, 2, 0)).work
    0.5
    >>> effect(pb, "g0", Send("a", 1, 0, "g1")).allocs
    ((('g1', 'a', 1, 0), 4),)
    """
    chain, L = problem.chain, problem.length
    x = chain.in_size
    training = problem.training if training is None else training
    if isinstance(op, Send | Recv) and op.index > L:
        raise InvalidSchedule(f"index {op.index} out of range 0..{L}")
    if isinstance(op, Recv):
        return Effect((), ((device, op.kind, op.index, op.mb),), (), 0.0, 0)
    if isinstance(op, Send):
        held, sent = (device, op.kind, op.index, op.mb), (op.peer, op.kind, op.index, op.mb)
        nbytes = x[op.index]
        return Effect(("link", device, op.peer), (held,), (sent,), 0.0, nbytes,
                      allocs=((sent, nbytes),), releases=(held,))  # fmt: skip
    if not isinstance(op, Fwd | Bwd | Wgt):
        raise InvalidSchedule(f"{op!r} is not a pipeline op")
    i, j, n = op.first, op.last, op.mb
    if not 0 <= i < j <= L:
        raise InvalidSchedule(f"stages out of range 0..{L}")
    compute = ("compute", device)
    a_in, a_out = (device, "a", i, n), (device, "a", j, n)
    d_in, d_out = (device, "d", j, n), (device, "d", i, n)
    stash, wdata = (device, "s", (i, j), n), (device, "w", (i, j), n)
    kept_out = (a_out,) if j < L else ()  # the output stays in the stash's last abar
    # a split backward without wgrad_bytes frees nothing early: its buffers live to W
    late_free = problem.wgrad_bytes is None and footprint is None and training
    inside = None if footprint is None else (footprint if held is None else held)
    if isinstance(op, Wgt):
        temp = max(chain.bwd_tmp[i:j]) if held is None else footprint - held
        kept = (stash, a_in) + ((d_in,) if j < L else ()) + kept_out if late_free else ()
        return Effect(compute, (wdata,), (), problem.wgrad_time(i, j), 0,
                      releases=(wdata, *kept), temp=temp)  # fmt: skip
    if isinstance(op, Fwd):
        reads = (a_in,) if i > 0 else ()
        work = sum(chain.fwd_time[i:j])
        adds = (a_out, stash) if training else (a_out,)
        out = ((a_out, x[j]),) if j < L else ()
        if training and footprint is not None:
            return Effect(compute, reads, adds, work, 0, allocs=((stash, inside),),
                          releases_start=reads, temp=footprint - inside)  # fmt: skip
        allocs = out + (((a_in, x[0]),) if i == 0 else ())
        if training:
            allocs += ((stash, stash_bytes(problem, i, j)),)
        return Effect(compute, reads, adds, work, 0, allocs=allocs,
                      releases=() if training else (a_in,),
                      temp=working_set(problem, i, j))  # fmt: skip
    work = sum(chain.bwd_time[i:j]) + op.recompute
    if op.part == "input":
        work -= problem.wgrad_time(i, j)
    if j == L:
        work += chain.fwd_time[L] + chain.bwd_time[L]
    reads = ((d_in,) if j < L else ()) + (stash,)
    out = ((d_out, x[i]),) if i > 0 else ()
    split = op.part == "input"
    adds = (d_out, wdata) if split else (d_out,)
    if footprint is not None:
        kept = inside if held is None else held + (x[j] if j < L else 0)
        late = ((wdata, wgrad_hold(problem, i, j, kept)),) if split else ()
        return Effect(compute, reads, adds, work, 0, allocs_end=out + late,
                      releases=(stash,), releases_start=reads[:-1],
                      temp=footprint - inside)  # fmt: skip
    freed = (stash, a_in) + reads[:-1] + kept_out
    if split and late_free:  # the stash, input, gradient and output are W's to free
        return Effect(compute, reads, adds, work, 0, allocs=out,
                      temp=working_set(problem, i, j, backward=True))  # fmt: skip
    late = ((wdata, sum(problem.wgrad_bytes[i:j])),) if split else ()
    return Effect(compute, reads, adds, work, 0, allocs=out, allocs_end=late, releases=freed,
                  temp=working_set(problem, i, j, backward=True))  # fmt: skip
