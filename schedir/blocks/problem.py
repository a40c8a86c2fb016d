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
``Loss``, ``B``; docs/semantics.md); what each op costs, in bytes and seconds, is
:func:`schedir.blocks.simulate.simulate_blocks`'s rule.

**Residuals in host memory.** An option may keep ``host`` bytes of its saved
residuals in host memory from its recording until its backward brings them back (a
*host-memory* variant: those its backward's first phase does not read, back before
the phase that first reads them, or all of them, those phase 0 reads back at its
start). Its ``saved`` counts the device part only; its ``rec_tmp`` includes the residuals' bytes
(the recording makes them on the device, then copies them out) and its ``bwd_tmp`` /
``bwd_release`` the bytes brought back from their phase on. While such a recording is
held (``abar[k+1]``, on the device or offloaded) its host bytes count in
``Trace.host_resident``, once; a whole-buffer copy moves its device part only.

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

from schedir.chain.problem import Chain
from schedir.errors import InvalidProblem, InvalidSchedule

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
