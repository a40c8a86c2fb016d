"""Pipeline schedules: per-device op lists and, typed, what their chunks run.

A :class:`PipelineSchedule` holds ``ops`` = ((device, (op, ...)), ...) (the ops of
:mod:`schedir.pipeline.ops`) and the structure the simulator and the executors read:

- ``plans``: one :class:`ChunkPlan` per chunk [first, last) of stages: its device,
  the bytes it holds per micro-batch (a plan's footprint), the plan it runs and the
  chain schedule of that plan (a rotor plan's ops), when the schedule has chunks;
- ``mapping``: the interval mapping it was built from, if any;
- ``periodic`` = K: the ops describe items 0..K-1 and item n + rK repeats the pattern
  of item n (:func:`expand`): for a training schedule with K = m this is the same
  step repeated, each device starting the next step when it is done with its own
  part of this one (no barrier between steps);
- ``release_interval``: item n enters at n times that many seconds (an inference
  pattern: its model period; 0: all at once).

``meta`` holds reporting facts only (method, model figures, solve time, ...): no
reader takes the schedule's structure from it, and a structural key there is refused.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from schedir.chain.ops import OP_TYPES
from schedir.chain.schedule import Schedule
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.offload.ops import COPY_OP_TYPES, parse_offload_op
from schedir.pipeline.ops import Bwd, Fwd, PipelineOp, Recv, Send, Wgt, parse_pipeline_op
from schedir.pipeline.problem import Mapping
from schedir.platform import LIMIT

PLAN_KINDS = ("store_all", "rotor", "offload")
# low-bit storages of a chunk's saved residuals (their codecs: jax_exec.auto.lowbit)
STORAGES = ("bfloat16", "float8_e4m3fn", "int8")
# meta keys that once carried structure: refused, so that none is silently ignored
STRUCTURE = {"plans": "plans", "stash": "plans (ChunkPlan.footprint)",
             "chunks": "plans", "mapping": "mapping", "periodic": "periodic"}  # fmt: skip


def check_count(name: str, value) -> int:
    """``value`` if it is an integer >= 1, else InvalidSchedule naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSchedule(f"{name} = {value!r}: expected an integer >= 1")
    return value


def check_seconds(name: str, value) -> float:
    """``value`` if it is finite non-negative seconds, else InvalidSchedule naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidSchedule(f"{name} = {value!r}: expected finite non-negative seconds")
    return value


@dataclass(frozen=True)
class ChunkPlan:
    """How chunk [first, last) of stages runs each micro-batch on ``device``.

    Attributes:
        first, last: its stages.
        device: the device running it.
        footprint: bytes it holds per micro-batch from its forward's start to its
            backward's end, in place of its own accounting
            (:func:`~schedir.pipeline.ops.effect`; a plan's peak covers its input,
            activations, the incoming gradient and temporaries); None: its own.
        kind: the plan (``"store_all"``, ``"rotor"``: rematerialization, ``"offload"``:
            rematerialization and activation offload; ``solvers.pipeline.stage_plans``);
            None: none chosen.
        extra: seconds at speed 1 it adds per micro-batch over store-all (carried out
            as its backwards' ``Bwd.recompute``).
        ops: the chain schedule of its sub-chain that the executors run (local stages
            0..last-first-1, its ``Loss`` the arrival of d_last or the real loss; an
            offload plan's with its copy ops, :mod:`schedir.offload.ops`);
            (): store-all, or the chunk checkpointed whole when its backwards recompute.
        held: bytes of the footprint it holds between its forward and its backward
            (what its chain schedule holds before its ``Loss``, e.g. rotor's
            checkpoints; at most ``footprint``), the rest being the working set of
            its ops; None: the whole footprint all along.
        storage: the storage of its stages' saved residuals, one of :data:`STORAGES`
            (low-bit; the footprint and held bytes count them stored); None: full
            precision.
        host: bytes it holds per micro-batch in host memory between its forward and
            its backward (an offload plan's offloaded buffers; ``held`` counts the
            device's only); None: none.
    """

    first: int
    last: int
    device: str
    footprint: int | None = None
    kind: str | None = None
    extra: float = 0.0
    ops: tuple = ()
    held: int | None = None
    storage: str | None = None
    host: int | None = None

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise InvalidSchedule(f"chunk plan {name} = {v!r}: expected a stage index")
        if self.first >= self.last:
            raise InvalidSchedule(f"chunk plan {self.first}:{self.last}: expected first < last")
        label = f"plan of chunk {self.first}:{self.last}"
        if not isinstance(self.device, str) or not self.device:
            raise InvalidSchedule(f"{label}: device = {self.device!r}: expected a device name")
        fp = _bytes_or_none(label, "footprint", self.footprint)
        if self.kind is not None and self.kind not in PLAN_KINDS:
            raise InvalidSchedule(f"{label}: kind = {self.kind!r}: expected one of "
                                  f"{', '.join(PLAN_KINDS)} or None")  # fmt: skip
        x = self.extra
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 <= x <= LIMIT:
            raise InvalidSchedule(f"{label}: extra = {x!r}: expected seconds in [0, 1e100]")
        if isinstance(self.ops, str) or not isinstance(self.ops, list | tuple):
            raise InvalidSchedule(f"{label}: ops = {self.ops!r}: expected chain or copy ops")
        ops = tuple(parse_offload_op(o) if isinstance(o, str) else o for o in self.ops)
        for o in ops:
            if type(o) not in OP_TYPES.values() and type(o) not in COPY_OP_TYPES.values():
                raise InvalidSchedule(f"{label}: {o!r} is not a chain or copy op")
        object.__setattr__(self, "ops", ops)
        h = self.held
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 0
                              or fp is None or h > fp):  # fmt: skip
            raise InvalidSchedule(f"{label}: held = {h!r}: expected bytes (an integer >= 0) "
                                  f"at most the footprint ({fp!r}), or None")  # fmt: skip
        _bytes_or_none(label, "host", self.host)
        if self.storage is not None and self.storage not in STORAGES:
            raise InvalidSchedule(f"{label}: storage = {self.storage!r}: expected one of "
                                  f"{', '.join(STORAGES)} or None")  # fmt: skip

    def to_dict(self) -> dict:
        out = {"chunk": [self.first, self.last], "device": self.device,
               "footprint": self.footprint, "kind": self.kind, "extra": self.extra}  # fmt: skip
        if self.ops:
            out["ops"] = [str(o) for o in self.ops]
        if self.held is not None:
            out["held"] = self.held
        if self.storage is not None:
            out["storage"] = self.storage
        if self.host is not None:
            out["host"] = self.host
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ChunkPlan:
        if not isinstance(d, dict) or not isinstance(d.get("chunk"), list) or len(d["chunk"]) != 2:
            raise InvalidSchedule(f"plan {_short(d)}: expected {{'chunk': [first, last], "
                                  "'device': ..., ...}")  # fmt: skip
        first, last = d["chunk"]
        return cls(first, last, d.get("device"), d.get("footprint"), d.get("kind"),
                   d.get("extra", 0.0), tuple(d.get("ops", ())), d.get("held"),
                   d.get("storage"), d.get("host"))  # fmt: skip


def _bytes_or_none(label: str, name: str, value) -> int | None:
    """``value`` if it is bytes (an integer >= 0) or None, else InvalidSchedule."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidSchedule(f"{label}: {name} = {value!r}: expected bytes (an integer >= 0) "
                              "or None")  # fmt: skip
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class PipelineSchedule(Schedule):
    """Per-device op lists, their typed structure and JSON-compatible metadata (see
    the module docstring).

    ``ops`` = ((device name, (op, ...)), ...); ``len(schedule)`` counts the ops of
    every device. JSON format ``schedir.pipeline_schedule`` (version 1; a missing
    version reads as 1; ``plans``, ``mapping``, ``periodic`` and ``release_interval``
    only when set)::

        {"format": "schedir.pipeline_schedule", "version": 1,
         "ops": [["gpu0", ["F(0:2,0)", "Send(a2,0,gpu1)"]], ["gpu1", [...]]], "meta": {},
         "plans": [{"chunk": [0, 2], "device": "gpu0", "footprint": 96, "kind": "rotor",
                    "extra": 0.5, "ops": ["F_ck(0)", ...], "held": 64,
                    "storage": "bfloat16"}, ...],
         "periodic": 2, "release_interval": 0.25}
    """

    plans: tuple[ChunkPlan, ...] = ()
    mapping: Mapping | None = None
    periodic: int | None = None
    release_interval: float = 0.0

    FORMAT: ClassVar[str] = "schedir.pipeline_schedule"
    OPS: ClassVar[str] = "a pipeline op (Fwd, Bwd, Wgt, Send, Recv)"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, field_name in STRUCTURE.items():
            if key in self.meta:
                raise InvalidSchedule(f"meta.{key} is not read: a pipeline schedule's "
                                      f"structure is its field {field_name}")  # fmt: skip
        if isinstance(self.plans, str) or not isinstance(self.plans, list | tuple):
            raise InvalidSchedule(f"plans = {_short(self.plans)}: expected ChunkPlans")
        plans = tuple(self.plans)
        seen = set()
        for p in plans:
            if not isinstance(p, ChunkPlan):
                raise InvalidSchedule(f"plans: {_short(p)} is not a ChunkPlan")
            if (p.first, p.last) in seen:
                raise InvalidSchedule(f"plans: chunk {p.first}:{p.last} has two plans")
            seen.add((p.first, p.last))
        object.__setattr__(self, "plans", plans)
        if self.mapping is not None and not isinstance(self.mapping, Mapping):
            raise InvalidSchedule(f"mapping = {_short(self.mapping)}: expected a Mapping")
        if self.periodic is not None:
            check_count("periodic", self.periodic)
        check_seconds("release_interval", self.release_interval)

    @staticmethod
    def parse_op(text: str):
        return parse_pipeline_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return isinstance(op, Fwd | Bwd | Wgt | Send | Recv)

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

    def plan(self, first: int, last: int) -> ChunkPlan | None:
        """The plan of chunk [first, last) (None: the schedule gives none)."""
        return next((p for p in self.plans if (p.first, p.last) == (first, last)), None)

    def footprints(self) -> dict[tuple[int, int], int]:
        """(first, last) -> bytes per micro-batch, for the chunks whose plan reserves a
        footprint (the others keep their own accounting)."""
        return {(p.first, p.last): p.footprint for p in self.plans if p.footprint is not None}

    def held_bytes(self) -> dict[tuple[int, int], int]:
        """(first, last) -> bytes per micro-batch held between forward and backward,
        for the chunks whose plan says (:attr:`ChunkPlan.held`)."""
        return {(p.first, p.last): p.held for p in self.plans if p.held is not None}

    def with_plans(self, plans: Iterable[ChunkPlan]) -> PipelineSchedule:
        """This schedule with ``plans`` in place of its plans of the same chunks (the
        others kept; a chunk it had none for is added after them)."""
        new = {(p.first, p.last): p for p in plans}
        kept = [new.pop((p.first, p.last), p) for p in self.plans]
        return dataclasses.replace(self, plans=(*kept, *new.values()))

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.plans:
            out["plans"] = [p.to_dict() for p in self.plans]
        if self.mapping is not None:
            out["mapping"] = self.mapping.to_dict()
        if self.periodic is not None:
            out["periodic"] = self.periodic
        if self.release_interval:
            out["release_interval"] = self.release_interval
        return out

    @classmethod
    def from_dict(cls, d: dict) -> PipelineSchedule:
        if isinstance(d, dict) and "version" not in d:
            d = {**d, "version": 1}
        if isinstance(d, dict) and d.get("format") == cls.FORMAT:
            ops = d.get("ops")
            if not isinstance(ops, list):
                raise InvalidSchedule(f"ops = {ops!r}: expected a list of [device, [op, ...]]")
        base = super().from_dict(d)
        plans = d.get("plans", [])
        if not isinstance(plans, list):
            raise InvalidSchedule(f"plans = {_short(plans)}: expected a list of chunk plans")
        mapping = d.get("mapping")
        if mapping is not None:
            try:
                mapping = Mapping.from_dict(mapping)
            except InvalidProblem as err:
                raise InvalidSchedule(str(err)) from None
        return dataclasses.replace(base, plans=tuple(ChunkPlan.from_dict(p) for p in plans),
                                   mapping=mapping, periodic=d.get("periodic"),
                                   release_interval=d.get("release_interval", 0.0))  # fmt: skip


def _shift(op: PipelineOp, offset: int) -> PipelineOp:
    """``op`` for item mb + offset (offset >= 0: still a valid op, not checked again)."""
    moved = copy.copy(op)
    object.__setattr__(moved, "mb", op.mb + offset)
    return moved


def expand(schedule: PipelineSchedule, items: int) -> PipelineSchedule:
    """The op lists of ``items`` items from a periodic pattern (a no-op otherwise)."""
    K = schedule.periodic
    if not K:
        return schedule
    reps = math.ceil(items / K)
    lists = []
    for dev, ops in schedule.ops:
        out = [_shift(o, r * K) for r in range(reps) for o in ops]
        lists.append((dev, tuple(o for o in out if o.mb < items)))
    return dataclasses.replace(schedule, ops=tuple(lists), periodic=None,
                               meta={**schedule.meta, "items": items})  # fmt: skip
