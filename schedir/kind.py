"""Problem kinds: one record per kind, read by io, simulate, render and the solvers.

A *kind* (chain, graph, offload, pipeline, blocks, or one you add: docs/extending.md)
is one subpackage of ``schedir`` holding its problem, ops, schedule, simulator and
JSON format. Its ``__init__`` builds one :class:`Kind` and calls :func:`register`;
:mod:`schedir.io` (``format_class``), :mod:`schedir.simulate` (``simulate``,
``judge``, the schedule-class check), :mod:`schedir.render` (``lanes``, ``memory``)
and ``solvers.solve`` (``budget``) all look the kind up here instead of keeping
tables of their own.

Conversions between kinds (a chain's graph, ``Chain.to_graph``) are *reductions*
registered by the kind that produces the target (the graph kind registers
``chain -> graph``), so that a kind never imports the kinds built on it:
:func:`convert` looks them up.

>>> import schedir
>>> from schedir import kind
>>> kind.of(schedir.Chain).name, kind.of(schedir.GraphSchedule).name
('chain', 'graph')
>>> kind.format_class("schedir.offload_problem").__name__
'OffloadProblem'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

BUDGETS = ("required", "none", "optional")


@dataclass(frozen=True)
class Kind:
    """Everything the generic calls need to know about one problem kind.

    Attributes:
        name: short name, e.g. ``"chain"`` (what ``schedir.kind.kinds()`` lists).
        problem: the problem class.
        schedules: the schedule classes its simulator reads; the first is the kind's
            own (the class its solvers return), the others are accepted too (an
            offload problem runs a plain chain ``Schedule``).
        formats: JSON ``format`` tag -> class with ``from_dict`` (the problem, the
            schedule, helper records such as a platform).
        simulate: ``simulate(problem, schedule_or_ops, **options) -> trace``; raises
            ``InvalidSchedule`` naming the op that cannot run.
        judge: ``judge(problem, trace, budget) -> dict`` of metadata, raising
            ``InvalidSchedule`` when the trace breaks the problem's limits; None: the
            default (the simulated peak fits ``budget`` bytes).
        lanes: ``lanes(problem, schedule, trace) -> {resource: [Span, ...]}`` for the
            renderings (one row per resource: compute, copy engines, devices, links).
        budget: ``"required"``: a solve needs a memory budget in bytes; ``"none"``:
            the limits live in the problem (per-device memories) and the budget is
            None; ``"optional"``: either.
        memory: ``memory(trace) -> (times, bytes)``, the memory curve drawn under the
            lanes (a step function, ``where='post'``); None: the chain form read from
            the trace's per-op ``start``/``end``/``op_peak``/``resident``.
    """

    name: str
    problem: type
    schedules: tuple[type, ...]
    formats: Mapping[str, type]
    simulate: Callable
    judge: Callable | None
    lanes: Callable
    budget: str = "required"
    memory: Callable | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Kind name = {self.name!r}: expected an identifier")
        if not isinstance(self.problem, type):
            raise TypeError(f"Kind {self.name}: problem = {self.problem!r}: expected a class")
        schedules = tuple(self.schedules)
        if not schedules or not all(isinstance(c, type) for c in schedules):
            raise TypeError(f"Kind {self.name}: schedules = {self.schedules!r}: expected classes")
        if self.budget not in BUDGETS:
            raise ValueError(f"Kind {self.name}: budget = {self.budget!r}: expected {BUDGETS}")
        for tag, cls in dict(self.formats).items():
            if not isinstance(tag, str) or not hasattr(cls, "from_dict"):
                raise TypeError(f"Kind {self.name}: formats[{tag!r}] = {cls!r}: no from_dict")
        object.__setattr__(self, "schedules", schedules)
        object.__setattr__(self, "formats", MappingProxyType(dict(self.formats)))

    @property
    def schedule(self) -> type:
        """The kind's own schedule class."""
        return self.schedules[0]


_KINDS: dict[str, Kind] = {}
# (source kind name, target kind name) -> function(source problem) -> target problem
_REDUCTIONS: dict[tuple[str, str], Callable] = {}


def register(kind: Kind) -> Kind:
    """Add ``kind`` (replacing a kind of the same name). Its format tags must not name
    another class in another kind (a shared record, ``schedir.platform``, is fine)."""
    if not isinstance(kind, Kind):
        raise TypeError(f"register: {kind!r} is not a schedir.kind.Kind")
    for other in _KINDS.values():
        clash = {t for t in set(other.formats) & set(kind.formats)
                 if other.formats[t] is not kind.formats[t]}  # fmt: skip
        if other.name != kind.name and clash:
            raise ValueError(f"kind {kind.name}: format {sorted(clash)[0]!r} is {other.name}'s")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> Kind:
    """Remove the kind called ``name`` (and its reductions); returns it."""
    if name not in _KINDS:
        raise KeyError(f"no kind {name!r} (known: {', '.join(_KINDS)})")
    for key in [k for k in _REDUCTIONS if name in k]:
        del _REDUCTIONS[key]
    return _KINDS.pop(name)


def kinds() -> tuple[Kind, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS.values())


def get(name: str) -> Kind:
    """The kind called ``name``; KeyError naming the known ones otherwise."""
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"no kind {name!r} (known: {', '.join(_KINDS)})") from None


def of(obj) -> Kind | None:
    """The kind of a problem, a schedule, or one of their classes (None: no kind).

    Looked up along the class's MRO, most derived first: a problem class names its
    kind, a schedule class the kind whose own schedule it is (``Schedule``: chain),
    any other format class (``Platform``) the kind that registered it.
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:
        for kind in _KINDS.values():
            if base is kind.problem or base is kind.schedule:
                return kind
    for base in cls.__mro__:
        for kind in _KINDS.values():
            if base in kind.formats.values():
                return kind
    return None


def format_class(tag: str) -> type | None:
    """The class that reads JSON ``format`` = ``tag`` (None when no kind registered it)."""
    for kind in _KINDS.values():
        if tag in kind.formats:
            return kind.formats[tag]
    return None


def format_tags() -> tuple[str, ...]:
    """Every registered JSON ``format`` tag."""
    return tuple(dict.fromkeys(tag for kind in _KINDS.values() for tag in kind.formats))


@dataclass(frozen=True)
class Reduction:
    """A registered conversion ``source`` kind -> ``target`` kind."""

    source: str
    target: str
    function: Callable = field(repr=False)


def register_reduction(source: str, target: str, function: Callable) -> None:
    """Register ``function(problem of kind source) -> problem of kind target``."""
    _REDUCTIONS[source, target] = function


def convert(obj, target: str):
    """``obj`` (a problem) as a problem of kind ``target``, through a registered
    reduction (e.g. ``convert(chain, "graph")`` = ``chain_to_graph(chain)``).

    Raises TypeError naming the source kind and the reductions known from it.
    """
    source = of(obj)
    if source is not None and source.name == target:
        return obj
    name = source.name if source is not None else type(obj).__name__
    function = _REDUCTIONS.get((name, target))
    if function is None:
        known = [t for s, t in _REDUCTIONS if s == name]
        raise TypeError(
            f"convert: no reduction {name} -> {target} (from {name}: {', '.join(known) or 'none'})"
        )
    return function(obj)


def reductions() -> tuple[Reduction, ...]:
    """The registered conversions."""
    return tuple(Reduction(s, t, f) for (s, t), f in _REDUCTIONS.items())
