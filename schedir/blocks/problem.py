"""The block-chain problem: a chain whose stages each offer several save options
(docs/auto.md, "The block chain").

A model cut into blocks is a chain (docs/semantics.md) with three refinements, each
needed to predict the op-by-op runtime's memory to the byte:

1. **Options.** A recorded stage (``F_all``) keeps what its chosen option saves:
   option o of stage k keeps ``saved`` bytes beyond the stage's outputs, and its
   recording forward and backward have their own times and temporary bytes
   (``rec_time``, ``rec_tmp``, ``bwd_time``, ``bwd_tmp``). A backward may free some
   of the stage's own buffers before its peak (``bwd_release`` bytes: its saved
   residuals, its outputs and their cotangents, once consumed; a backward run as
   several kernels does). One option per stage: a schedule names them
   (:class:`~schedir.blocks.schedule.BlockSchedule`'s ``options``, an index per stage).
2. **Values by identity.** The input a_c of stage c is a set of values (``cuts[c]``,
   ids into ``value_sizes``); a value read several cuts later (a skip connection)
   belongs to every cut in between, and is counted once however many resident
   buffers hold it. Buffers: ``a[c]`` = the values of ``cuts[c]``; ``abar[c]`` = the
   same plus the saved residuals of stage c-1's option.
3. **Gradients.** ``d[c]`` holds one cotangent per value of ``cuts[c]`` with
   ``grad_sizes[v] > 0`` (values that do not depend on a parameter, e.g. integer
   masks or RNG counters, have none). ``B(c)`` computes new cotangents for the values
   stage c reads; a value it does not read keeps the same cotangent array as in
   ``d[c+1]`` (counted once). The loss reads all of ``cuts[L]``.

Ops, their order rules and the errors are the chain's (``F_ck``, ``F_n``, ``F_all``,
``Loss``, ``B``; docs/semantics.md). Memory needed by an op = bytes of the union of
the resident buffers right after it adds its output, plus its temporary bytes (plain
forwards ``fwd_tmp``, recording forwards the option's ``rec_tmp``, backwards its
``bwd_tmp`` minus its ``bwd_release``, the loss ``loss_tmp``).

**Residuals in host memory.** An option may keep ``host`` bytes of its saved
residuals in host memory from its recording until its backward brings them back (a
*host-memory* variant: those its backward's first phase does not read, back before
the phase that first reads them, or all of them, those phase 0 reads back at its
start). Its ``saved`` counts the device part only; its ``rec_tmp`` includes the residuals' bytes
(the recording makes them on the device, then copies them out) and its ``bwd_tmp`` /
``bwd_release`` the bytes brought back from their phase on. While such a recording is
held (``abar[k+1]``, on the device or offloaded) its host bytes count in
``Trace.host_resident``, once; a whole-buffer copy moves its device part only.

**Its copies overlap compute.** ``copy_out`` seconds of its ``rec_time`` and
``copy_back`` of its ``bwd_time`` are its copies (:class:`BlockOption`). The times a
schedule's ops sum to (``Trace.serial_makespan``) charge them whole, what the block DP
minimizes; ``Trace.makespan`` runs them on the copy engines
(:class:`~schedir.offload.engines.CopyEngines`, the offload simulator's rule): the
copy-out starts when the recording's compute ends and runs beside the ops after it;
the copy-back is issued when the compute op before the backward starts (one op
ahead, as a ``Prefetch`` placed before it), once the copy-out is done, and the
backward starts when it is complete (waiting only for what is left). The bytes stay
those of program order, what the op-by-op runtime (which has no concurrency) measures
after every op: the residuals leave the device when the recording ends and come back
in the backward; on a device that overlaps, each copy's device buffer lives from its
start to its end, up to those bytes more during the ops it overlaps.

:meth:`BlockChain.to_chain` turns a choice of options into a plain
:class:`~schedir.chain.Chain` whose sizes are the per-buffer sums (and fwd_tmp the
larger of the plain and recording forward): its simulated peak is never below this
model's, and equal when no value crosses two cuts, every cut value has a cotangent of
its own size and no backward releases anything.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from schedir.chain.ops import B, F_all, Loss, buffer_moves, check_complete_step
from schedir.chain.problem import Chain
from schedir.chain.schedule import as_ops
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.offload.effects import CopyStates
from schedir.offload.engines import CopyEngines
from schedir.offload.ops import Evict, Offload, Prefetch, Wait
from schedir.trace import Trace, TraceRecorder

FORMAT = "schedir.block_chain"


def _int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidProblem(f"{where} = {value!r}: expected a whole number of bytes")
    if not math.isfinite(float(value)) or float(value) != int(value) or value < 0:
        raise InvalidProblem(f"{where} = {value!r}: expected a non-negative whole number of bytes")
    return int(value)


def _time(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidProblem(f"{where} = {value!r}: expected seconds")
    if not math.isfinite(float(value)) or value < 0:
        raise InvalidProblem(f"{where} = {value!r}: times must be finite and non-negative")
    return float(value)


@dataclass(frozen=True)
class BlockOption:
    """What a recorded stage keeps and costs under one save option.

    Attributes:
        name: e.g. ``"save all"``, ``"save 3/7"``, ``"checkpoint_dots"``.
        saved: bytes kept by ``F_all`` beyond the stage's outputs (its residuals).
        rec_time: seconds of the recording forward.
        rec_tmp: temporary bytes of the recording forward.
        bwd_time: seconds of the backward (recomputation included).
        bwd_tmp: temporary bytes of the backward (recomputed values included).
        bwd_release: bytes of the stage's own buffers (its saved residuals, the values
            it makes and their cotangents) the backward has freed at its peak; at most
            those bytes (checked by :class:`BlockChain`).
        host: bytes of its saved residuals kept in host memory from the recording
            until the backward brings them back (not in ``saved``; module docstring).
        copy_out: seconds of ``rec_time`` copying the ``host`` bytes out (on the
            offload engine, overlapping later ops in ``Trace.makespan``).
        copy_back: seconds of ``bwd_time`` copying them back (on the prefetch engine).
    """

    name: str
    saved: int
    rec_time: float
    rec_tmp: int
    bwd_time: float
    bwd_tmp: int
    bwd_release: int = 0
    host: int = 0
    copy_out: float = 0.0
    copy_back: float = 0.0

    def __post_init__(self) -> None:
        for f in ("saved", "rec_tmp", "bwd_tmp", "bwd_release", "host"):
            object.__setattr__(self, f, _int(f"option {self.name!r}.{f}", getattr(self, f)))
        for f in ("rec_time", "bwd_time", "copy_out", "copy_back"):
            object.__setattr__(self, f, _time(f"option {self.name!r}.{f}", getattr(self, f)))
        for copy, total in (("copy_out", "rec_time"), ("copy_back", "bwd_time")):
            if getattr(self, copy) > getattr(self, total):
                raise InvalidProblem(
                    f"option {self.name!r}.{copy} = {getattr(self, copy)}: a part of its "
                    f"{total} ({getattr(self, total)}), not more"
                )
            if getattr(self, copy) > 0 and self.host == 0:
                raise InvalidProblem(
                    f"option {self.name!r}.{copy} = {getattr(self, copy)}: it copies "
                    f"nothing (host = 0)"
                )


@dataclass(frozen=True)
class BlockStage:
    """One stage (block) of a :class:`BlockChain`.

    Attributes:
        name: display name.
        fwd_time: seconds of the plain forward (``F_ck``, ``F_n``).
        fwd_tmp: temporary bytes of the plain forward.
        reads: value ids of its input cut that it reads.
        options: its save options (at least one).
    """

    name: str
    fwd_time: float
    fwd_tmp: int
    reads: tuple[int, ...]
    options: tuple[BlockOption, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fwd_time", _time(f"{self.name}.fwd_time", self.fwd_time))
        object.__setattr__(self, "fwd_tmp", _int(f"{self.name}.fwd_tmp", self.fwd_tmp))
        object.__setattr__(self, "reads", tuple(int(v) for v in self.reads))
        options = tuple(self.options)
        if not options:
            raise InvalidProblem(f"stage {self.name!r} has no options")
        for o in options:
            if not isinstance(o, BlockOption):
                raise InvalidProblem(f"stage {self.name!r}: option {o!r} is not a BlockOption")
        object.__setattr__(self, "options", options)


@dataclass(frozen=True)
class BlockChain:
    """L stages with save options, then a loss (see the module docstring).

    Attributes:
        value_sizes: bytes of each forward value (ids index this tuple).
        grad_sizes: bytes of each value's cotangent (0: none).
        cuts: ``cuts[c]``, c = 0..L: the values of a_c (a_0 is usually empty).
        stages: the L stages.
        loss_time: seconds of the loss op (loss stage's forward and backward).
        loss_tmp: its temporary bytes.
    """

    value_sizes: tuple[int, ...]
    grad_sizes: tuple[int, ...]
    cuts: tuple[tuple[int, ...], ...]
    stages: tuple[BlockStage, ...]
    loss_time: float
    loss_tmp: int
    produced: tuple[frozenset[int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = tuple(_int(f"value_sizes[{i}]", v) for i, v in enumerate(self.value_sizes))
        grads = tuple(_int(f"grad_sizes[{i}]", v) for i, v in enumerate(self.grad_sizes))
        if len(grads) != len(sizes):
            raise InvalidProblem(
                f"grad_sizes has {len(grads)} entries, value_sizes {len(sizes)}: one per value"
            )
        stages = tuple(self.stages)
        L = len(stages)
        cuts = tuple(tuple(sorted({int(v) for v in c})) for c in self.cuts)
        if len(cuts) != L + 1:
            raise InvalidProblem(f"cuts has {len(cuts)} entries, expected L + 1 = {L + 1}")
        for c, cut in enumerate(cuts):
            for v in cut:
                if not 0 <= v < len(sizes):
                    raise InvalidProblem(f"cuts[{c}]: value {v} is not in value_sizes")
        where: dict[int, list[int]] = {}
        for c, cut in enumerate(cuts):
            for v in cut:
                where.setdefault(v, []).append(c)
        for v, cs in where.items():
            if cs != list(range(cs[0], cs[-1] + 1)):
                raise InvalidProblem(
                    f"value {v} is in cuts {cs}: a value crosses consecutive cuts only"
                )
        produced = []
        for k, stage in enumerate(stages):
            if not isinstance(stage, BlockStage):
                raise InvalidProblem(f"stages[{k}] = {stage!r}: expected a BlockStage")
            extra = set(stage.reads) - set(cuts[k])
            if extra:
                raise InvalidProblem(
                    f"stages[{k}] ({stage.name}).reads: values {sorted(extra)} are not in cuts[{k}]"
                )
            produced.append(frozenset(cuts[k + 1]) - frozenset(cuts[k]))
        object.__setattr__(self, "cuts", cuts)
        object.__setattr__(self, "value_sizes", sizes)
        object.__setattr__(self, "grad_sizes", grads)
        object.__setattr__(self, "stages", stages)
        for k, stage in enumerate(stages):
            own = self.own_bytes(k, produced[k])
            for o in stage.options:
                if o.bwd_release > o.saved + o.host + own:
                    raise InvalidProblem(
                        f"stages[{k}] ({stage.name}) option {o.name!r}.bwd_release = "
                        f"{o.bwd_release}: a backward frees at most the stage's own "
                        f"{o.saved + o.host + own} bytes (saved residuals, values it makes, "
                        f"their cotangents)"
                    )
        for c in range(1, L):
            for v in cuts[c]:
                if v not in cuts[L] and not any(v in s.reads for s in stages[c:]):
                    raise InvalidProblem(
                        f"cuts[{c}]: value {v} is read by no later stage nor the loss"
                    )
        object.__setattr__(self, "value_sizes", sizes)
        object.__setattr__(self, "grad_sizes", grads)
        object.__setattr__(self, "cuts", cuts)
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "loss_time", _time("loss_time", self.loss_time))
        object.__setattr__(self, "loss_tmp", _int("loss_tmp", self.loss_tmp))
        object.__setattr__(self, "produced", tuple(produced))

    @property
    def length(self) -> int:
        """L, the number of stages before the loss."""
        return len(self.stages)

    def own_bytes(self, k: int, produced: frozenset[int] | None = None) -> int:
        """Bytes of the values stage k makes and of the cotangents in ``d[k+1]`` that
        ``d[k]`` does not keep: what its backward may free besides its residuals."""
        made = self.produced[k] if produced is None else produced
        gone = self.grad_ids(k + 1) - self.grad_ids(k)
        return sum(self.value_sizes[v] for v in made) + sum(self.grad_sizes[v] for v, _ in gone)

    def grad_ids(self, c: int) -> frozenset[tuple[int, int]]:
        """Cotangent identities of ``d[c]``: ``(value, r)`` with r the first stage at or
        after c that reads the value (L: the loss), whose backward makes that array."""
        L = self.length
        out = set()
        for v in self.cuts[c]:
            if self.grad_sizes[v] == 0:
                continue
            r = next((k for k in range(c, L) if v in self.stages[k].reads), L)
            out.add((v, r))
        return frozenset(out)

    def store_all_time(self) -> float:
        """Seconds without recomputation, each stage with its fastest option."""
        return (
            math.fsum(min(o.rec_time + o.bwd_time for o in s.options) for s in self.stages)
            + self.loss_time
        )

    def compute_only(self) -> BlockChain:
        """This chain with its options' copies left out of their times (``rec_time``
        less ``copy_out``, ``bwd_time`` less ``copy_back``): the time of each op when
        its copies are hidden, a lower bound; the bytes are the same."""

        def hidden(o: BlockOption) -> BlockOption:
            if not (o.copy_out or o.copy_back):
                return o
            return dataclasses.replace(
                o, rec_time=o.rec_time - o.copy_out, bwd_time=o.bwd_time - o.copy_back,
                copy_out=0.0, copy_back=0.0,
            )  # fmt: skip

        stages = tuple(
            dataclasses.replace(s, options=tuple(hidden(o) for o in s.options)) for s in self.stages
        )
        return dataclasses.replace(self, stages=stages)

    def check_options(self, options: Sequence[int]) -> tuple[int, ...]:
        """``options`` as a tuple of valid option indices, one per stage."""
        if isinstance(options, str | bytes) or not isinstance(options, Sequence):
            raise InvalidSchedule(f"options = {options!r}: expected one option index per stage")
        if len(options) != self.length:
            raise InvalidSchedule(
                f"options has {len(options)} entries, the block chain {self.length} stages"
            )
        out = []
        for k, o in enumerate(options):
            if isinstance(o, bool) or not isinstance(o, numbers.Integral):
                raise InvalidSchedule(f"options[{k}] = {o!r}: expected an option index")
            if not 0 <= o < len(self.stages[k].options):
                raise InvalidSchedule(
                    f"options[{k}] = {o}: stage {self.stages[k].name} has "
                    f"{len(self.stages[k].options)} options"
                )
            out.append(int(o))
        return tuple(out)

    def to_chain(self, options: Sequence[int]) -> Chain:
        """The plain chain of this choice of options (an upper bound, see module doc)."""
        opts = self.check_options(options)
        L = self.length
        size = self.value_sizes

        def cut_bytes(c: int) -> int:
            a = sum(size[v] for v in self.cuts[c])
            d = sum(self.grad_sizes[v] for v in self.cuts[c])
            return max(a, d)

        in_size = [cut_bytes(c) for c in range(L + 1)]
        chosen = [s.options[o] for s, o in zip(self.stages, opts, strict=True)]
        return Chain(
            fwd_time=tuple(s.fwd_time for s in self.stages) + (0.0,),
            bwd_time=tuple(o.bwd_time for o in chosen) + (self.loss_time,),
            in_size=tuple(in_size),
            saved_size=tuple(in_size[k + 1] + chosen[k].saved for k in range(L)) + (0,),
            fwd_tmp=tuple(
                max(s.fwd_tmp, o.rec_tmp) for s, o in zip(self.stages, chosen, strict=True)
            )
            + (0,),
            bwd_tmp=tuple(o.bwd_tmp for o in chosen) + (self.loss_tmp,),
            names=tuple(s.name for s in self.stages) + ("loss",),
        )

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": 1,
            "value_sizes": list(self.value_sizes),
            "grad_sizes": list(self.grad_sizes),
            "cuts": [list(c) for c in self.cuts],
            "stages": [
                {
                    "name": s.name,
                    "fwd_time": s.fwd_time,
                    "fwd_tmp": s.fwd_tmp,
                    "reads": list(s.reads),
                    "options": [o.__dict__.copy() for o in s.options],
                }
                for s in self.stages
            ],
            "loss_time": self.loss_time,
            "loss_tmp": self.loss_tmp,
        }

    @classmethod
    def from_dict(cls, d: dict) -> BlockChain:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InvalidProblem(f"format = {d.get('format') if isinstance(d, dict) else d!r}: "
                                 f"expected {FORMAT!r}")  # fmt: skip
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        try:
            stages = tuple(
                BlockStage(
                    name=s["name"],
                    fwd_time=s["fwd_time"],
                    fwd_tmp=s["fwd_tmp"],
                    reads=tuple(s["reads"]),
                    options=tuple(BlockOption(**o) for o in s["options"]),
                )
                for s in d["stages"]
            )
            return cls(
                value_sizes=tuple(d["value_sizes"]),
                grad_sizes=tuple(d["grad_sizes"]),
                cuts=tuple(tuple(c) for c in d["cuts"]),
                stages=stages,
                loss_time=d["loss_time"],
                loss_tmp=d["loss_tmp"],
            )
        except (KeyError, TypeError) as err:
            raise InvalidProblem(f"block chain JSON: {err!r}") from None


def schedule_options(problem: BlockChain, schedule: object) -> tuple[int, ...]:
    """The option indices a schedule uses (a :class:`BlockSchedule`'s ``options``),
    checked against ``problem``."""
    from schedir.blocks.schedule import BlockSchedule

    if not isinstance(schedule, BlockSchedule):
        raise InvalidSchedule(
            f"a block-chain schedule is a BlockSchedule naming one option per stage, got "
            f"{type(schedule).__name__}"
        )
    return problem.check_options(schedule.options)


def simulate_blocks(problem: BlockChain, schedule_or_ops, *, record_buffers: bool = False) -> Trace:
    """Run a schedule on a :class:`BlockChain` (module docstring); a chain ``Trace``.

    The schedule may hold copy ops (an ``OffloadSchedule``: ``Offload``, ``Prefetch``,
    ``Wait`` on ``a``, ``abar`` and ``d`` buffers), with the rules of
    :mod:`schedir.offload.effects` in program order: a buffer counts on the device
    from its ``Prefetch`` until its ``Wait`` after an ``Offload``, and its host copy in
    ``host_resident`` (these copies take no time here: the offload simulator times
    them). An option's ``host`` bytes count in ``host_resident`` while its recording
    is held, and its copies run on the copy engines (module docstring: ``makespan``
    overlaps them, ``serial_makespan`` charges them whole).

    Raises :class:`InvalidSchedule` naming the op, as the chain simulator does, and
    when the schedule is not a :class:`BlockSchedule` of valid options.
    """
    opts = schedule_options(problem, schedule_or_ops)
    ops = as_ops(schedule_or_ops)
    L = problem.length
    vsize, gsize = problem.value_sizes, problem.grad_sizes

    def members(buf: tuple[str, int]) -> frozenset:
        kind, c = buf
        if kind == "d":
            return frozenset(("d", v, r) for v, r in problem.grad_ids(c))
        base = frozenset(("v", v) for v in problem.cuts[c])
        if kind != "abar":
            return base
        late = problem.stages[c - 1].options[opts[c - 1]].host > 0
        return base | {("s", c - 1)} | ({("h", c - 1)} if late else set())

    def nbytes(item: tuple) -> int:
        if item[0] == "v":
            return vsize[item[1]]
        if item[0] == "d":
            return gsize[item[1]]
        option = problem.stages[item[1]].options[opts[item[1]]]
        return option.saved if item[0] == "s" else option.host

    resident: dict[tuple[str, int], frozenset] = {("a", 0): members(("a", 0))}
    host: dict[tuple[str, int], frozenset] = {}
    states = CopyStates({("a", 0): "dev"})
    done = [False] * (L + 1)

    class Bytes(dict):  # item -> nbytes(item), each computed once (summed in C below)
        def __init__(self, device: bool) -> None:
            super().__init__()
            self.device = device  # residuals kept on the host ("h") count 0 on the device

        def __missing__(self, item: tuple) -> int:
            self[item] = 0 if self.device and item[0] == "h" else nbytes(item)
            return self[item]

    size, on_device = Bytes(device=False), Bytes(device=True)

    def total(held: dict) -> int:  # device bytes
        live = set().union(*held.values()) if held else set()
        return sum(map(on_device.__getitem__, live))

    def host_total() -> int:  # copies of offloaded buffers and held host residuals, once
        late = {i for held in resident.values() for i in held if i[0] == "h"}
        return sum(map(size.__getitem__, late.union(*host.values())))

    def fail(i: int, op, why: str) -> InvalidSchedule:
        return InvalidSchedule(f"op {i}: {op}: {why}")

    recorder = TraceRecorder(total(resident), record_buffers)
    host_after: list[int] = []
    copies = _CopyStream()
    for i, op in enumerate(ops):
        if isinstance(op, Offload | Prefetch | Wait | Evict):
            buf = op.key
            if buf[0] not in ("a", "abar", "d") or not 0 <= buf[1] <= L:
                raise fail(i, op, f"{op.buffer} is not a buffer of this block chain")
            try:
                change = states.effect(op)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            if change.host_add:
                host[buf] = resident[buf]
            if change.device_drop:
                del resident[buf]
            if change.device_add:
                resident[buf] = host[buf]
            if change.host_drop:
                del host[buf]
            now = total(resident)
            recorder.record(now, now, 0.0, lambda: (f"{b[0]}[{b[1]}]" for b in resident))
            host_after.append(host_total())
            continue
        try:  # the chain's op table; the costs are the block options'
            reads, adds, frees = buffer_moves(op, L, resident)
            for change in states.reads(reads):
                del host[change.buffer]
        except InvalidSchedule as err:
            raise fail(i, op, str(err)) from None
        k = L if isinstance(op, Loss) else op.index
        if isinstance(op, Loss | B) and done[k]:
            what = "the loss" if k == L else f"B({k})"
            raise fail(i, op, f"{what} already ran (every backward runs exactly once)")
        for buf in adds:
            try:
                states.add(buf)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            resident[buf] = members(buf)
        option = None
        if isinstance(op, Loss):
            need, dt = total(resident) + problem.loss_tmp, problem.loss_time
        else:
            stage = problem.stages[k]
            option = stage.options[opts[k]]
            if isinstance(op, B):
                need = total(resident) + option.bwd_tmp - option.bwd_release
                dt = option.bwd_time
            elif isinstance(op, F_all):
                need, dt = total(resident) + option.rec_tmp, option.rec_time
            else:
                need, dt = total(resident) + stage.fwd_tmp, stage.fwd_time
        for buf in frees:
            try:
                states.free(buf)
            except InvalidSchedule as err:
                raise fail(i, op, str(err)) from None
            del resident[buf]
        done[k] = done[k] or isinstance(op, Loss | B)
        copies.run(recorder, op, option, need, total(resident), dt,
                   lambda: (f"{b[0]}[{b[1]}]" for b in resident))  # fmt: skip
        host_after.append(host_total())
    check_complete_step(done, len(ops))
    trace = recorder.trace(ops)
    return dataclasses.replace(
        trace,
        makespan=max(trace.makespan, copies.last),
        serial_makespan=copies.serial,
        host_resident=tuple(host_after),
    )


class _CopyStream:
    """The copies of host-memory variants on the copy engines, beside the compute ops
    (module docstring): when each op starts, and the serialized time."""

    def __init__(self) -> None:
        self.engines = CopyEngines()
        self.copied_out: dict[int, float] = {}  # stage -> when its copy-out ends
        self.before = 0.0  # start of the last compute op
        self.last = 0.0  # end of the last copy
        self.serial = 0.0

    def run(self, recorder: TraceRecorder, op, option, need, resident, dt, names) -> None:
        """Record compute op ``op`` (``option``: its stage's, None for the loss) taking
        ``dt`` seconds, its copies included."""
        self.serial += dt
        wait, out = 0.0, 0.0
        if option is not None and isinstance(op, B) and option.copy_back:
            ready = max(self.before, self.copied_out.get(op.index, 0.0))
            wait = self.engines.issue("prefetch", ready, option.copy_back)[1]
            self.last = max(self.last, wait)
            dt -= option.copy_back
        elif option is not None and isinstance(op, F_all):
            out = option.copy_out
            dt -= out
        recorder.record(need, resident, dt, names, not_before=wait)
        self.before = recorder.start[-1]
        if out:
            end = self.engines.issue("offload", recorder.clock, out)[1]
            self.copied_out[op.index] = end
            self.last = max(self.last, end)
