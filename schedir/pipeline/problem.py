"""Pipeline problems: a Chain over several devices, and interval mappings
(docs/pipelines.md, "Problems").

:class:`PipelineProblem` is the chain, the stages' weights, the platform and the
micro-batches; an :class:`Interval` places stages [first, last) on one device or
replicates it on several (round-robin), and a :class:`Mapping` is consecutive
intervals covering the chain. The costs the simulator, the models and the solvers
share are read here: :func:`link_time`, :func:`working_set`, :func:`capacity`. The
period model of mappings is :mod:`schedir.steady.periods`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.chain.problem import Chain
from schedir.errors import InvalidProblem
from schedir.platform import Platform, check_bytes, check_number

# A schedule holds ops per micro-batch and stage, and the simulator runs every one of
# them: beyond this a training step, or the default simulated stream, never finishes.
MAX_MICROBATCHES = 100_000


@dataclass(frozen=True)
class PipelineProblem:
    """A chain to pipeline over the devices of a platform.

    Attributes:
        chain: the stages; for inference only ``fwd_time`` and ``in_size`` matter
            (plus ``fwd_tmp`` for memory); for training also the backward fields.
        weights: bytes of the parameters of each stage (length L). Count gradients and
            optimizer state here too if they live on the device.
        platform: devices (speed, memory) and links.
        microbatches: micro-batches per training step (training), or items simulated
            by default (inference).
        training: False: a stream of inference inputs; True: training (GPipe, 1F1B,
            zero-bubble, interleaved schedules).
        wgrad_fraction: optional, one number in [0, 1] per stage (length L): the share
            of ``chain.bwd_time[k]`` that is stage k's weight gradient (the ``W`` op of a
            split backward); the input gradient (``Bwd(part="input")``) takes the rest
            and the loss's backward. None: 0 for every stage (a split backward's input
            part takes the whole time and ``W`` none, as a full backward would).
        wgrad_bytes: optional, bytes per stage (length L) that stage k's weight gradient
            still needs after its input gradient is done (for a matmul: the layer's input
            and its output cotangent), held from the end of ``Bwd(part="input")`` to the
            end of ``W``. None: ``W`` holds everything the input part would have freed
            (the stash, the input and the incoming gradient: a split backward frees
            nothing earlier than a full one).
        target_bytes: bytes of one micro-batch's target (the labels ``y``), which the
            chunk with the loss holds from its forward's start to its backward's end
            (training; 0: not counted).
    """

    chain: Chain
    weights: tuple[int, ...]
    platform: Platform
    microbatches: int = 8
    training: bool = False
    wgrad_fraction: tuple[float, ...] | None = None
    wgrad_bytes: tuple[int, ...] | None = None
    target_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.chain, Chain):
            raise InvalidProblem(f"chain = {self.chain!r}: expected a Chain")
        if not isinstance(self.platform, Platform):
            raise InvalidProblem(f"platform = {self.platform!r}: expected a Platform")
        L = self.chain.length
        try:
            weights = tuple(self.weights)
        except TypeError:
            raise InvalidProblem(f"weights = {self.weights!r}: expected a list of bytes") from None
        if len(weights) != L:
            raise InvalidProblem(
                f"weights: expected {L} byte counts (one per stage), got {len(weights)}"
            )
        for k, w in enumerate(weights):
            check_bytes(f"weights[{k}]", w)
        object.__setattr__(self, "weights", tuple(int(w) for w in weights))
        # every time and size the models add, multiply or divide stays finite
        c = self.chain
        for name in ("fwd_time", "bwd_time"):
            for k, t in enumerate(getattr(c, name)):
                check_number(f"chain {name}[{k}]", t, what="time (s)")
        for name in ("in_size", "saved_size", "fwd_tmp", "bwd_tmp"):
            for k, n in enumerate(getattr(c, name)):
                check_bytes(f"chain {name}[{k}]", n)
        if not self.platform.devices:
            raise InvalidProblem("pipeline problem: the platform lists no devices")
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise InvalidProblem(f"microbatches = {m!r}: expected an integer >= 1")
        if m > MAX_MICROBATCHES:
            raise InvalidProblem(
                f"microbatches = {m!r}: at most {MAX_MICROBATCHES:,} (schedules and the "
                "simulator hold ops per micro-batch and stage)"
            )
        object.__setattr__(self, "microbatches", int(m))
        if not isinstance(self.training, bool):
            raise InvalidProblem(f"training = {self.training!r}: expected true or false")
        object.__setattr__(self, "target_bytes", int(check_bytes("target_bytes",
                                                                 self.target_bytes)))  # fmt: skip
        self._check_split()

    def _check_split(self) -> None:
        """``wgrad_fraction`` and ``wgrad_bytes``: None or one valid entry per stage."""
        L = self.chain.length
        for name in ("wgrad_fraction", "wgrad_bytes"):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
                raise InvalidProblem(f"{name} = {values!r}: expected a list (one per stage)")
            if len(values) != L:
                raise InvalidProblem(f"{name}: expected {L} entries (one per stage), got "
                                     f"{len(values)}")  # fmt: skip
            if name == "wgrad_bytes":
                checked = tuple(check_bytes(f"{name}[{k}]", v) for k, v in enumerate(values))
                object.__setattr__(self, name, tuple(int(v) for v in checked))
                continue
            out = []
            for k, v in enumerate(values):
                f = check_number(f"{name}[{k}]", v, what="fraction in [0, 1]")
                if f > 1:
                    raise InvalidProblem(f"{name}[{k}] = {v!r}: expected a fraction in [0, 1]")
                out.append(f)
            object.__setattr__(self, name, tuple(out))

    def wgrad_time(self, i: int, j: int) -> float:
        """Seconds (at speed 1) of the weight-gradient part of stages i..j-1."""
        f = self.wgrad_fraction
        if f is None:
            return 0.0
        return sum(f[k] * self.chain.bwd_time[k] for k in range(i, j))

    @property
    def length(self) -> int:
        return self.chain.length

    def work(self, i: int, j: int) -> float:
        """Seconds (at speed 1) of the forward of stages i..j-1 (inference) or of
        forward + backward (training; the loss counts in the last interval)."""
        c = self.chain
        w = sum(c.fwd_time[i:j])
        if self.training:
            w += sum(c.bwd_time[i:j])
            if j == c.length:
                w += c.fwd_time[-1] + c.bwd_time[-1]
        return w

    def to_dict(self) -> dict:
        return {
            "format": "schedir.pipeline",
            "version": 1,
            "chain": self.chain.to_dict(),
            "weights": list(self.weights),
            "platform": self.platform.to_dict(),
            "microbatches": self.microbatches,
            "training": self.training,
            **{name: list(getattr(self, name)) for name in ("wgrad_fraction", "wgrad_bytes")
               if getattr(self, name) is not None},
            **({"target_bytes": self.target_bytes} if self.target_bytes else {}),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> PipelineProblem:
        if not isinstance(d, dict) or d.get("format") != "schedir.pipeline":
            raise InvalidProblem("expected a JSON object with format 'schedir.pipeline'")
        if d.get("version", 1) != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        for key in ("chain", "weights", "platform"):
            if key not in d:
                raise InvalidProblem(f"pipeline problem: missing field {key!r}")
        if not isinstance(d["weights"], list):
            raise InvalidProblem(f"weights = {d['weights']!r}: expected a list of bytes")
        return cls(
            Chain.from_dict(d["chain"]),
            tuple(d["weights"]),
            Platform.from_dict(d["platform"]),
            d.get("microbatches", 8),
            d.get("training", False),
            d.get("wgrad_fraction"),
            d.get("wgrad_bytes"),
            d.get("target_bytes", 0),
        )


@dataclass(frozen=True)
class Interval:
    """Stages [first, last) placed on ``devices`` (round-robin in this order)."""

    first: int
    last: int
    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidProblem(f"interval {name} = {v!r}: expected a stage index")
        if isinstance(self.devices, str) or not all(isinstance(u, str) for u in self.devices):
            raise InvalidProblem(f"interval devices = {self.devices!r}: expected device names")
        object.__setattr__(self, "devices", tuple(self.devices))
        if not 0 <= self.first < self.last or not self.devices:
            raise InvalidProblem(f"interval {self}: expected first < last and >= 1 device")

    def __str__(self) -> str:
        return f"[{self.first}:{self.last})@{'+'.join(self.devices)}"


@dataclass(frozen=True)
class Mapping:
    """Consecutive intervals covering stages 0..L-1, on disjoint device sets."""

    intervals: tuple[Interval, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "intervals", tuple(self.intervals))

    def check(self, problem: PipelineProblem) -> None:
        """InvalidProblem unless this is an interval mapping of ``problem``."""
        pos, used = 0, set()
        for iv in self.intervals:
            if iv.first != pos:
                raise InvalidProblem(f"mapping: interval {iv} does not start at stage {pos}")
            pos = iv.last
            for name in iv.devices:
                problem.platform.device(name)
                if name in used:
                    raise InvalidProblem(f"mapping: device {name!r} is used twice")
                used.add(name)
        if pos != problem.length:
            raise InvalidProblem(f"mapping covers stages 0..{pos - 1}, not 0..{problem.length - 1}")

    def to_dict(self) -> list:
        return [[iv.first, iv.last, list(iv.devices)] for iv in self.intervals]

    @classmethod
    def from_dict(cls, d: Sequence) -> Mapping:
        try:
            return cls(tuple(Interval(a, b, tuple(devs)) for a, b, devs in d))
        except (TypeError, ValueError) as err:
            if isinstance(err, InvalidProblem):
                raise
            raise InvalidProblem(
                f"mapping {d!r}: expected [[first, last, [devices]], ...]"
            ) from None

    def __str__(self) -> str:
        return " ".join(str(iv) for iv in self.intervals)


def link_time(problem: PipelineProblem, src: str, dst: str, nbytes: int) -> float:
    """Seconds a message of ``nbytes`` occupies link src -> dst (inf if there is none)."""
    link = problem.platform.find_link(src, dst)
    return math.inf if link is None else link.time(nbytes)


def working_set(problem: PipelineProblem, i: int, j: int, backward: bool = False) -> int:
    """Bytes live inside one op on stages [i, j) besides its input and output: the
    largest temporary (fwd_tmp or bwd_tmp) plus the activations between stages."""
    c = problem.chain
    x, tmp = c.in_size, (c.bwd_tmp if backward else c.fwd_tmp)
    return max(
        tmp[k] + (x[k] if k > i else 0) + (x[k + 1] if k + 1 < j else 0) for k in range(i, j)
    )


def capacity(problem: PipelineProblem, name: str, budget: int | None = None) -> int | None:
    """Bytes device ``name`` may hold: its memory, and ``budget`` if given (None: no limit)."""
    caps = [c for c in (problem.platform.device(name).memory, budget) if c is not None]
    return min(caps) if caps else None
