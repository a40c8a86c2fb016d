"""The chain problem: L stages in sequence followed by a loss (docs/semantics.md).

All sizes are non-negative integers (bytes, or memory slots once discretized) and all
times are non-negative finite floats (seconds); values whose sums overflow (a makespan
beyond the float range, sizes totalling 2**62 bytes or more) are refused. Every
per-stage field has length L + 1; index L is the loss stage.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from schedir.errors import InvalidProblem

TIME_FIELDS = ("fwd_time", "bwd_time")
SIZE_FIELDS = ("in_size", "saved_size", "fwd_tmp", "bwd_tmp")
FIELDS = TIME_FIELDS + SIZE_FIELDS
# Solvers add sizes in int64 arrays: every sum of sizes must stay below 2**63.
MAX_TOTAL_SIZE = 2**62


def _as_size(name: str, index: int, value: object) -> int:
    """Return ``value`` as an exact non-negative int; never round."""
    if isinstance(value, bool):
        raise InvalidProblem(f"{name}[{index}] = {value!r}: sizes must be integers, not bool")
    if isinstance(value, numbers.Integral):
        size = int(value)
    elif (
        isinstance(value, numbers.Real)
        and math.isfinite(float(value))
        and float(value).is_integer()
    ):
        size = int(value)
    else:
        raise InvalidProblem(
            f"{name}[{index}] = {value!r}: sizes must be non-negative integers (bytes or slots)"
        )
    if size < 0:
        raise InvalidProblem(f"{name}[{index}] = {value!r}: sizes must be non-negative")
    return size


def _as_time(name: str, index: int, value: object) -> float:
    return seconds(f"{name}[{index}]", value)


def seconds(where: str, value: object) -> float:
    """``value`` as a time in seconds: a finite, non-negative real, or InvalidProblem
    naming ``where`` (the chain's and the graph's times alike)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidProblem(f"{where} = {value!r}: times must be real numbers (seconds)")
    try:
        time = float(value)
    except OverflowError:
        raise InvalidProblem(f"{where} = {value!r}: time too large for a float") from None
    if not math.isfinite(time) or time < 0:
        raise InvalidProblem(f"{where} = {value!r}: times must be finite and non-negative")
    return time


def _largest(chain, names: tuple[str, ...]) -> str:
    """``field[k] = value`` of the largest entry among the fields ``names``."""
    name, k = max(((n, k) for n in names for k in range(len(getattr(chain, n)))),
                  key=lambda nk: getattr(chain, nk[0])[nk[1]])  # fmt: skip
    return f"{name}[{k}] = {getattr(chain, name)[k]!r}"


def scaled_sum(factor: float, values) -> float:
    """``factor * fsum(values)`` in seconds, inf when it overflows a float."""
    try:
        return factor * math.fsum(values)
    except OverflowError:
        return math.inf


def _check_totals(chain) -> None:
    """Refuse values whose sums overflow: a makespan must be a finite float and every
    sum of sizes an int64 (docs/semantics.md)."""
    L = len(chain.fwd_time) - 1
    # every forward at most L + 1 times (a persistent schedule), every backward once; x4:
    # room for the DP's partial sums
    bound = scaled_sum(4 * (L + 1), chain.fwd_time) + scaled_sum(4, chain.bwd_time)
    if not math.isfinite(bound):
        raise InvalidProblem(
            f"fwd_time, bwd_time: times too large, a makespan would overflow a float "
            f"(largest: {_largest(chain, TIME_FIELDS)}); express them in a larger unit"
        )
    if sum(sum(getattr(chain, name)) for name in SIZE_FIELDS) >= MAX_TOTAL_SIZE:
        raise InvalidProblem(
            f"in_size, saved_size, fwd_tmp, bwd_tmp: sizes too large, their total reaches "
            f"2**62 (largest: {_largest(chain, SIZE_FIELDS)}); express them in a larger unit"
        )


@dataclass(frozen=True)
class Chain:
    """A heterogeneous chain of ``length`` = L stages and a loss (rotor's model).

    Attributes (each a tuple of length L + 1, index L being the loss stage):
        fwd_time: forward time of stage k, seconds (loss: 0 by convention).
        bwd_time: backward time of stage k, seconds (loss: loss and its gradient).
        in_size: bytes x_k of the input a_k of stage k, and of its gradient d_k.
        saved_size: bytes s_k kept after a recording forward of stage k: a_{k+1} plus
            every residual the backward needs (loss: 0).
        fwd_tmp: extra bytes live only during stage k's forward (loss: 0).
        bwd_tmp: extra bytes live only during stage k's backward (loss: of the loss).
        names: optional stage names (length L + 1).
    """

    fwd_time: tuple[float, ...]
    bwd_time: tuple[float, ...]
    in_size: tuple[int, ...]
    saved_size: tuple[int, ...]
    fwd_tmp: tuple[int, ...]
    bwd_tmp: tuple[int, ...]
    names: tuple[str, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        lengths = {}
        for name in FIELDS:
            values = getattr(self, name)
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray):
                raise InvalidProblem(f"{name} = {values!r}: expected a sequence of numbers")
            lengths[name] = len(values)
        expected = lengths["fwd_time"]
        if expected < 1:
            raise InvalidProblem("fwd_time has length 0: a chain needs at least the loss stage")
        for name, n in lengths.items():
            if n != expected:
                raise InvalidProblem(
                    f"{name} has length {n} but fwd_time has length {expected}: every field "
                    f"needs L + 1 entries (index L is the loss)"
                )
        for name in TIME_FIELDS:
            values = tuple(_as_time(name, k, v) for k, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        for name in SIZE_FIELDS:
            values = tuple(_as_size(name, k, v) for k, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        _check_totals(self)
        if self.names is not None:
            if isinstance(self.names, str):
                raise InvalidProblem(f"names = {self.names!r}: expected a sequence of strings")
            names = tuple(self.names)
            if len(names) != expected:
                raise InvalidProblem(f"names has length {len(names)}, expected {expected}")
            for k, n in enumerate(names):
                if not isinstance(n, str):
                    raise InvalidProblem(f"names[{k}] = {n!r}: stage names must be strings")
            object.__setattr__(self, "names", names)

    @property
    def length(self) -> int:
        """L, the number of stages before the loss."""
        return len(self.fwd_time) - 1

    @classmethod
    def from_rotor(
        cls,
        fw: Sequence[float],
        bw: Sequence[float],
        cw: Sequence[int],
        cbw: Sequence[int],
        ftmp: Sequence[int],
        btmp: Sequence[int],
        names: Sequence[str] | None = None,
    ) -> Chain:
        """Build a chain from rotor's six lists (lengths L, L+1, L+1, L+1, L, L+1).

        >>> c = Chain.from_rotor([1, 2], [3, 4, 1], [10, 20, 30], [0, 25, 35], [0, 0], [0, 0, 0])
        >>> c.saved_size, c.length
        ((25, 35, 0), 2)
        """
        L = len(fw)
        expect = {"fw": L, "bw": L + 1, "cw": L + 1, "cbw": L + 1, "ftmp": L, "btmp": L + 1}
        given = {"fw": fw, "bw": bw, "cw": cw, "cbw": cbw, "ftmp": ftmp, "btmp": btmp}
        for name, n in expect.items():
            if len(given[name]) != n:
                raise InvalidProblem(
                    f"rotor list {name} has length {len(given[name])}, expected {n} (L = {L})"
                )
        return cls(
            fwd_time=tuple(fw) + (0.0,),
            bwd_time=tuple(bw),
            in_size=tuple(cw),
            saved_size=tuple(cbw[1:]) + (0,),
            fwd_tmp=tuple(ftmp) + (0,),
            bwd_tmp=tuple(btmp),
            names=None if names is None else tuple(names),
        )

    def to_rotor(self) -> dict[str, list]:
        """Rotor's six lists (``cbw[0]``, which rotor never reads, is set to ``in_size[0]``).

        Raises InvalidProblem if the loss stage has a non-zero ``fwd_time``,
        ``saved_size`` or ``fwd_tmp``, which rotor's lists cannot hold.
        """
        L = self.length
        for name in ("fwd_time", "saved_size", "fwd_tmp"):
            value = getattr(self, name)[L]
            if value != 0:
                raise InvalidProblem(
                    f"{name}[{L}] = {value!r}: rotor's lists have no entry for the loss "
                    f"stage's {name}; fold it into bwd_time[{L}] / bwd_tmp[{L}] first"
                )
        return {
            "fw": list(self.fwd_time[:L]),
            "bw": list(self.bwd_time),
            "cw": list(self.in_size),
            "cbw": [self.in_size[0]] + list(self.saved_size[:L]),
            "ftmp": list(self.fwd_tmp[:L]),
            "btmp": list(self.bwd_tmp),
        }

    # Arrays for the numeric code (in_size is padded with x_{L+1} = 0).
    def arrays(self) -> dict[str, np.ndarray]:
        """Fields as numpy arrays; ``in_size`` gets the extra entry x_{L+1} = 0."""
        out = {name: np.asarray(getattr(self, name), dtype=np.float64) for name in TIME_FIELDS}
        for name in SIZE_FIELDS:
            out[name] = np.asarray(getattr(self, name), dtype=np.int64)
        out["in_size"] = np.append(out["in_size"], 0)
        return out

    def to_graph(self):
        """This chain as a ``schedir.Graph`` whose nodes cost what running them costs
        (``schedir.graph.chain_to_graph``: one node per output, so a recording forward
        is two runs of the stage there).

        The graph kind registers that conversion (``schedir.kind.convert(chain,
        "graph")``): the chain kind does not import the kinds built on it."""
        from schedir.kind import convert

        return convert(self, "graph")

    def store_all_time(self) -> float:
        """Makespan without recomputation: every forward and backward once."""
        return math.fsum(self.fwd_time) + math.fsum(self.bwd_time)

    def to_dict(self) -> dict:
        d: dict = {"format": "schedir.chain", "version": 1}
        for name in FIELDS:
            d[name] = list(getattr(self, name))
        if self.names is not None:
            d["names"] = list(self.names)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Chain:
        if not isinstance(d, dict):
            raise InvalidProblem(f"expected a JSON object for a chain, got {type(d).__name__}")
        if d.get("format") != "schedir.chain":
            raise InvalidProblem(f"format = {d.get('format')!r}: expected 'schedir.chain'")
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        missing = [name for name in FIELDS if name not in d]
        if missing:
            raise InvalidProblem(f"chain JSON lacks field(s) {', '.join(missing)}")
        return cls(**{name: d[name] for name in FIELDS}, names=d.get("names"))
