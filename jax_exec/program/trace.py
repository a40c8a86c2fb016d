"""Trace ``loss_fn(model, *args)`` into a flat forward program (docs/auto.md, "Tracing").

The model is split (``nnx.split(model, nnx.Param, ...)``, or another filter of its
parameters: ``nnx.LoRAParam``) into its differentiated parameters and the rest of its
state; :func:`trace` builds the pure function
``f(params, rest, args) -> (loss, aux, new_rest)`` that merges the model, calls
``loss_fn`` and splits the updated state back, and traces it with ``jax.make_jaxpr``.
The jaxpr is flattened into a :class:`Program`: one list of :class:`Eqn` over integer
value ids, with every nested ``jit`` inlined (its equations become the program's, so
cuts and options can fall inside it). ``custom_jvp`` / ``custom_vjp`` calls, user
``jax.checkpoint`` regions, ``cond`` and other higher-order primitives stay single
equations (opaque: JAX differentiates them as a whole). A ``scan`` (``nnx.scan``,
``lax.scan``) is unrolled into its iterations (a chain of identical blocks): its
stacked global inputs (a scanned stack's parameters) become per-iteration slices,
globals too (``Program.derived``). Equations with side effects are refused with an
error naming the primitive and the user code it came from; debug callbacks
(``jax.debug.print``) are left out of the planned step with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.extend.random as jax_random
import numpy as np
from flax import nnx
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

INLINED = ("jit", "pjit", "closed_call", "core_call")
# A model's own rematerialization (``nnx.remat``, ``jax.checkpoint``) is planned from its
# inside: its equations become the program's and the plan decides what is saved (the
# user's policy is not kept; the values are the same).
CHECKPOINTS = ("checkpoint", "remat", "remat2")


class UnsupportedModel(TypeError):
    """The planner cannot handle an operation or a piece of the model; the message
    names it and where it came from."""


@dataclass(frozen=True)
class Lit:
    """A literal operand (a trace-time constant scalar)."""

    value: Any


Ref = int | Lit


@dataclass(frozen=True, eq=False)
class Eqn:
    """One equation of the flat program.

    Attributes:
        primitive: the JAX primitive.
        params: its parameters (as in the jaxpr).
        ins: operands: value ids, or :class:`Lit` for literals.
        outs: value ids of the results.
        source: where it came from (user file:line and JAX's name stack).
        ctx: the equation's context manager factory (``eqn.ctx``), kept to bind alike.
    """

    primitive: Any
    params: dict
    ins: tuple[Ref, ...]
    outs: tuple[int, ...]
    source: str
    ctx: Any = None

    @property
    def name(self) -> str:
        return self.primitive.name

    def bind(self, *args: Any) -> list:
        """Apply the equation to concrete or traced operands; a list of results."""
        params = self.primitive.get_bind_params(self.params)
        manager = getattr(self.ctx, "manager", None)
        if manager is not None:
            with manager:
                out = self.primitive.bind(*args, **params)
        else:
            out = self.primitive.bind(*args, **params)
        return list(out) if self.primitive.multiple_results else [out]


@dataclass(frozen=True)
class ScanInfo:
    """Where an unrolled scan's iterations are in the flat program.

    Attributes:
        starts: equation index where each iteration starts, then where the last ends.
        carries: the carry values entering each iteration, then the final carry.
        ys: per iteration (in execution order), its per-iteration outputs.
        reverse: whether the scan ran its iterations in reverse.
    """

    starts: tuple[int, ...]
    carries: tuple[tuple[Ref, ...], ...]
    ys: tuple[tuple[Ref, ...], ...]
    reverse: bool


@dataclass(frozen=True, eq=False)
class Program:
    """The model's forward computation as flat equations over value ids.

    Attributes:
        avals: shape and dtype of every value id (``jax.ShapeDtypeStruct``).
        eqns: the equations in execution (topological) order.
        param_ids, rest_ids, arg_ids: value ids of the flattened parameters, other
            model state and call arguments (the program's inputs).
        consts: value id -> constant array (closed-over constants of the jaxpr).
        loss: the loss (a value id; a constant loss is one of ``consts``).
        aux: the flattened auxiliary outputs (``has_aux``).
        new_rest: the flattened model state after the call.
        written: ``(index, value)`` of each parameter ``loss_fn`` wrote (its flat index,
            its value after the call): layers that normalize a wrapped layer's weights
            in place (``nnx.WeightNorm``, ``nnx.SpectralNorm``). Gradients are for the
            values before the call, as ``nnx.value_and_grad`` gives them; the new values
            come back with the state (:meth:`outputs`).
        treedefs: ``(params, rest, args, aux)`` tree structures.
        weak: the inputs traced weakly typed (a parameter made from a Python scalar):
            both executors give their blocks them strongly typed, a value of the step
            (:func:`~jax_exec.program.model.global_values`).
    """

    avals: tuple
    eqns: tuple[Eqn, ...]
    param_ids: tuple[int, ...]
    rest_ids: tuple[int, ...]
    arg_ids: tuple[int, ...]
    consts: dict
    loss: int
    aux: tuple[Ref, ...]
    new_rest: tuple[Ref, ...]
    treedefs: tuple
    written: tuple[tuple[int, Ref], ...] = ()
    producer: dict = field(default_factory=dict)  # value id -> index of its equation
    derived: dict = field(default_factory=dict)  # value id -> (global id, index)
    scans: tuple = ()  # per unrolled scan: its ScanInfo
    # value id -> where it lives when the model is sharded over several devices, and
    # parameter id -> where its gradient goes (jax_exec.program.placement); empty: one
    # device, bytes are whole
    shardings: dict = field(default_factory=dict)
    grad_shardings: dict = field(default_factory=dict)
    weak: frozenset = frozenset()

    @property
    def input_ids(self) -> tuple[int, ...]:
        """The globals: inputs, constants and slices of stacked globals (scans)."""
        return (
            self.param_ids + self.rest_ids + self.arg_ids + tuple(self.consts)
            + tuple(self.derived)
        )  # fmt: skip

    @property
    def param_like(self) -> frozenset[int]:
        """Parameters and the slices of stacked parameters (differentiated)."""
        found = set(self.param_ids)
        for vid, (src, _) in sorted(self.derived.items()):
            if src in found:
                found.add(vid)
        return frozenset(found)

    @property
    def written_ids(self) -> tuple[Ref, ...]:
        """The values the written parameters hold after the call (:attr:`written`)."""
        return tuple(ref for _, ref in self.written)

    def outputs(self, loss: Any, values: dict, results: dict) -> tuple[Any, Any]:
        """``(aux, new_state)`` of a step from the values of the globals (``values``) and
        of the blocks' results (``results``), the loss given (``aux`` may hold it: the
        usual metrics), as every executor assembles them. ``new_state``: the model's
        state other than its parameters after the call, and the parameters ``loss_fn``
        wrote (:attr:`written`) with their new values."""
        found = {**results, self.loss: loss}

        def value(ref: Ref) -> Any:
            if isinstance(ref, Lit):
                return ref.value
            return values[ref] if ref in values else found[ref]

        _, r_def, _, aux_def = self.treedefs
        aux = jax.tree_util.tree_unflatten(aux_def, [value(r) for r in self.aux])
        new_rest = jax.tree_util.tree_unflatten(r_def, [value(r) for r in self.new_rest])
        if not self.written:
            return aux, new_rest
        # each parameter's flat index at its place in the tree, to find their paths
        where = jax.tree_util.tree_unflatten(self.treedefs[0], range(len(self.param_ids)))
        new = dict(self.written)
        flat = [(path, var.replace(value(new[var.get_value()])))
                for path, var in nnx.to_flat_state(where) if var.get_value() in new]  # fmt: skip
        return aux, nnx.merge_state(new_rest, nnx.from_flat_state(flat))

    def nbytes(self, vid: int) -> int:
        """Bytes of value ``vid`` on one device (its largest shard when sharded)."""
        return aval_bytes(self.avals[vid], self.shardings.get(vid))

    def spec(self, vid: int) -> Any:
        """Shape and dtype of value ``vid``, with its sharding when the model is sharded
        (a kernel compiled for it takes the value where it lives)."""
        aval, sharding = self.avals[vid], self.shardings.get(vid)
        if sharding is None:
            return aval
        weak = getattr(aval, "weak_type", False)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding, weak_type=weak)


def strongly_typed(v: Any) -> Any:
    """``v`` without its weak type (a value the step made from Python numbers,
    ``jnp.minimum(1.0, step / 10)``): the same dtype, strongly typed as the cut values'
    specs (``Program.spec``) that blocks and stages are traced at. Traced with a weakly
    typed input, a function's ``convert_element_type`` that was the identity makes a new
    value, and a vjp closure no longer matches the recipe made from the first trace. The
    identity on strongly typed values."""
    return jax.lax.convert_element_type(v, v.dtype) if getattr(v, "weak_type", False) else v


def sub_jaxprs(params: dict) -> list:
    """The jaxprs among an equation's parameters (a loop's body, a branch, a checkpoint's
    or a custom rule's program), searched in tuples and lists too, in order: each a
    ``ClosedJaxpr`` or an open ``Jaxpr`` as the parameter holds it."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, ClosedJaxpr | Jaxpr):
                found.append(item)
    return found


def aval_bytes(aval: Any, sharding: Any = None) -> int:
    """Bytes of an array of this shape and dtype on one device: with a ``sharding``, of
    its largest shard (``sharding.shard_shape``); the planner and the op-by-op runtime
    both count a value so."""
    shape = tuple(aval.shape) if sharding is None else sharding.shard_shape(tuple(aval.shape))
    return math.prod(shape) * int(aval.dtype.itemsize)  # (math.prod: ~10x numpy's, per call)


def source_of(eqn: Any, fallback: str = "") -> str:
    """``file:line (function)`` of the user code that made ``eqn``, and its name stack
    (``fallback``, the enclosing ``jit``'s source, when the traceback has no user frame)."""
    where = ""
    tb = getattr(eqn.source_info, "traceback", None)
    frames = getattr(tb, "frames", None) or ()
    for frame in frames:
        path = frame.file_name.replace("\\", "/")
        if "/jax/" in path or "/flax/" in path or "/jax_exec/auto/" in path:
            continue
        where = f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
        break
    if not where:
        return fallback or "unknown source"
    stack = str(getattr(eqn.source_info, "name_stack", "") or "")
    return f"{where} [{stack}]" if stack else where


class _Builder:
    def __init__(self) -> None:
        self.avals: list = []
        self.eqns: list[Eqn] = []
        self.consts: dict[int, Any] = {}
        self.globals: set[int] = set()
        self.derived: dict[int, tuple[int, int]] = {}
        self.scans: list[ScanInfo] = []
        self.unroll = True
        self.inlined = INLINED + CHECKPOINTS

    def slice_of(self, ref: Ref, i: int, where: str, index: int | None = None) -> Ref:
        """``ref[i]``: a global slice (no equation) for stacked globals, else traced: a
        ``dynamic_slice`` at ``index[i]``, a slice of the scan's global iteration index
        (so that every iteration's equations are the same and the compiled path can run
        them as a loop, :mod:`jax_exec.execute.loops`)."""
        if isinstance(ref, Lit):
            return Lit(np.asarray(ref.value)[i])
        aval = self.avals[ref]
        if ref in self.globals:
            for vid, (src, j) in self.derived.items():
                if src == ref and j == i:
                    return vid
            vid = self.new(jax.ShapeDtypeStruct(tuple(aval.shape[1:]), aval.dtype))
            self.derived[vid] = (ref, i)
            self.globals.add(vid)
            return vid
        if index is None:
            closed = jax.make_jaxpr(lambda x: x[i])(aval)
            return self.inline(closed.jaxpr, closed.consts, [ref], where)[0]
        at = self.slice_of(index, i, where)
        closed = jax.make_jaxpr(lambda x, t: jax.lax.dynamic_index_in_dim(x, t, 0, keepdims=False))(
            aval, self.avals[at]
        )
        return self.inline(closed.jaxpr, closed.consts, [ref, at], where)[0]

    def iteration_index(self, length: int) -> int:
        """A global constant ``arange(length)``: a scan's iteration indices."""
        vid = self.new(jax.ShapeDtypeStruct((length,), np.int32))
        self.consts[vid] = np.arange(length, dtype=np.int32)
        self.globals.add(vid)
        return vid

    def unsliced(self, parts: list[Ref]) -> int | None:
        """The stacked global whose slices 0, 1, ... are ``parts``, if they are."""
        found = [self.derived.get(r) if not isinstance(r, Lit) else None for r in parts]
        if not found or any(f is None for f in found):
            return None
        src = found[0][0]
        if [f for f in found] != [(src, i) for i in range(len(parts))]:
            return None
        return src if self.avals[src].shape[0] == len(parts) else None

    def unroll_scan(self, eqn: Any, ins: list[Ref], where: str) -> list[Ref]:
        """A ``scan`` as its iterations one after another (each one the body's
        equations); the stacked inputs are sliced, the stacked outputs stacked."""
        p = eqn.params
        if p.get("_split_transpose"):  # pragma: no cover - an internal AD variant
            raise UnsupportedModel(f"scan at {where}: a split-transpose scan is not supported")
        n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
        body = p["jaxpr"]
        consts, carry, xs = (
            ins[:n_consts],
            ins[n_consts : n_consts + n_carry],
            ins[n_consts + n_carry :],
        )
        order = range(length - 1, -1, -1) if p["reverse"] else range(length)
        traced = [r for r in xs if not isinstance(r, Lit) and r not in self.globals]
        index = self.iteration_index(length) if traced else None
        ys: list[list[Ref]] = []
        starts, carries = [], []
        for i in order:
            starts.append(len(self.eqns))
            carries.append(tuple(carry))
            xs_i = [self.slice_of(r, i, where, index) for r in xs]
            outs = self.inline(body.jaxpr, body.consts, [*consts, *carry, *xs_i], where)
            carry = outs[:n_carry]
            ys.append(outs[n_carry:])
        starts.append(len(self.eqns))
        carries.append(tuple(carry))
        self.scans.append(
            ScanInfo(tuple(starts), tuple(carries), tuple(tuple(y) for y in ys), bool(p["reverse"]))
        )
        if p["reverse"]:
            ys.reverse()
        stacked = []
        for j, var in enumerate(eqn.outvars[n_carry:]):
            parts = [y[j] for y in ys]
            whole = self.unsliced(parts)
            if whole is not None:  # the slices of a stacked global, back in order (nnx.scan
                stacked.append(whole)  # returns the stack's parameters): that global
                continue
            avals = [
                self.avals[r]
                if not isinstance(r, Lit)
                else var.aval.update(shape=var.aval.shape[1:])
                for r in parts
            ]
            # concatenate of expanded slices, not jnp.stack: JAX >= 0.10 binds a
            # `stack` primitive the analysis does not know
            closed = jax.make_jaxpr(
                lambda *a: jax.lax.concatenate([jax.lax.expand_dims(x, (0,)) for x in a], 0)
            )(*avals)
            stacked.append(self.inline(closed.jaxpr, closed.consts, parts, where)[0])
        return [*carry, *stacked]

    def new(self, aval: Any) -> int:
        self.avals.append(jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype))
        return len(self.avals) - 1

    def inline(
        self, jaxpr: Jaxpr, consts: Sequence, args: Sequence[Ref], where: str = ""
    ) -> list[Ref]:
        env: dict = {}
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            vid = self.new(var.aval)
            self.consts[vid] = value
            self.globals.add(vid)
            env[var] = vid
        for var, ref in zip(jaxpr.invars, args, strict=True):
            env[var] = ref

        def read(atom: Any) -> Ref:
            return Lit(atom.val) if isinstance(atom, Literal) else env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if eqn.primitive.name in self.inlined and _closed(eqn) is not None:
                inner = _closed(eqn)
                outs = self.inline(inner.jaxpr, inner.consts, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            if eqn.primitive.name == "scan" and self.unroll:
                outs = self.unroll_scan(eqn, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            expanded = _expand(eqn, self.avals, ins)
            if expanded is not None:  # random bits: as XLA computes them (see _expand)
                outs = self.inline(expanded.jaxpr, expanded.consts, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            if eqn.effects and _debug_only(eqn):  # jax.debug.print / callback / breakpoint
                _warn_debug(eqn, source_of(eqn, where))
                continue
            if eqn.effects:
                raise UnsupportedModel(
                    f"operation {eqn.primitive.name} at {source_of(eqn, where)} has side effects "
                    f"({', '.join(map(str, eqn.effects))}): a schedule may run it twice "
                    f"(recomputation), so the planner refuses it; remove it from loss_fn"
                )
            outs = tuple(self.new(v.aval) for v in eqn.outvars)
            for var, vid in zip(eqn.outvars, outs, strict=True):
                env[var] = vid
            self.eqns.append(
                Eqn(
                    eqn.primitive,
                    dict(eqn.params),
                    tuple(ins),
                    outs,
                    source_of(eqn, where),
                    eqn.ctx,
                )
            )
        return [read(v) for v in jaxpr.outvars]


@functools.cache
def _threefry_dtype() -> Any:
    """The dtype of a threefry key; computed on first use, since creating a key at
    import time would start JAX's backend (``jax.distributed.initialize`` must come
    before that)."""
    return jax.eval_shape(lambda: jax.random.key(0, impl="threefry2x32")).dtype


def _expand(eqn: Any, avals: list, ins: list) -> ClosedJaxpr | None:
    """``random_bits`` of a threefry key as JAX's own implementation of it
    (``threefry_prng_impl.random_bits``: ``threefry2x32`` of a counter, then the
    ``xor`` of its two outputs), so that the program holds what XLA holds: XLA keeps
    the generator's two outputs and fuses the ``xor`` into its readers. Same bits (the
    same function lowers the primitive). Other equations: None."""
    if eqn.primitive.name != "random_bits" or isinstance(ins[0], Lit):
        return None
    key = avals[ins[0]]
    if key.dtype != _threefry_dtype() or key.shape != ():
        return None
    width, shape = eqn.params["bit_width"], tuple(eqn.params["shape"])

    def bits(k: Any) -> Any:
        return jax_random.threefry_prng_impl.random_bits(jax.random.key_data(k), width, shape)

    return jax.make_jaxpr(bits)(jax.ShapeDtypeStruct((), key.dtype))


def _closed(eqn: Any) -> ClosedJaxpr | None:
    for key in ("jaxpr", "call_jaxpr"):
        inner = eqn.params.get(key)
        if isinstance(inner, ClosedJaxpr):
            return inner
        if isinstance(inner, Jaxpr):
            return ClosedJaxpr(inner, ())
    return None


@dataclass(frozen=True)
class Traced:
    """A model and loss traced once for given argument shapes.

    Attributes:
        program: the flat forward program.
        graphdef: the model's graph definition (``nnx.split``).
        params, rest: the model's parameter and other state (as split at trace time).
        pure: ``pure(params, rest, args) -> (loss, aux, new_params, new_rest)``, the
            traced function.
        has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
        wrt: the Flax filter that split ``params`` from ``rest`` (:func:`split_model`):
            the model is split so to run a plan.
    """

    program: Program
    graphdef: Any
    params: Any
    rest: Any
    pure: Callable
    has_aux: bool
    wrt: Any = nnx.Param


def _state_change(before: Any, after: Any) -> str:
    """The variables created and removed between two states, by path (a few)."""

    def paths(tree: Any) -> set[str]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {jax.tree_util.keystr(path) for path, _ in leaves}

    old, new = paths(before), paths(after)
    said = [
        f"{what} {', '.join(sorted(found)[:3])}{' ...' if len(found) > 3 else ''}"
        for what, found in (("created", new - old), ("removed", old - new))
        if found
    ]
    return "; ".join(said) or "variables created or removed"


def _debug_only(eqn: Any) -> bool:
    """Whether ``eqn`` is a debug callback (``jax.debug.print``, ``jax.debug.callback``,
    ``jax.debug.breakpoint``): no results, debug effects only."""
    names = {type(effect).__name__ for effect in eqn.effects}
    return not eqn.outvars and names <= {"DebugEffect", "OrderedDebugEffect"}


_DEBUG_WARNED: set[str] = set()


def _warn_debug(eqn: Any, source: str) -> None:
    """Warn, once per place, that a debug callback is left out of the planned step."""
    if source in _DEBUG_WARNED:
        return
    _DEBUG_WARNED.add(source)
    warnings.warn(
        f"{eqn.primitive.name} at {source} is left out of the planned step: a schedule "
        f"runs blocks out of program order and recomputes them, so it would print or call "
        f"back out of order and more than once; the values are unchanged (call "
        f"nnx.value_and_grad to see it)",
        stacklevel=4,
    )


def split_model(model: Any, wrt: Any = nnx.Param, field: str = "") -> tuple[Any, Any, Any]:
    """``nnx.split(model, wrt, ...)``: the differentiated parameters (``wrt``, a Flax
    filter of ``nnx.Param`` variables: ``nnx.Param``, ``nnx.LoRAParam``...) and the
    rest of the state, with a clear error for non-NNX models and for a filter that
    selects variables other than parameters (naming ``field``, default ``wrt = ...``)."""
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"model must be a Flax nnx.Module (loss_fn(model, *args) is called with it), "
            f"got {type(model).__name__}"
        )
    graphdef, params, rest = nnx.split(model, wrt, ...)
    for path, variable in nnx.to_flat_state(params):
        if not isinstance(variable, nnx.Param):
            raise ValueError(
                f"{field or f'wrt = {wrt!r}'} selects {'.'.join(map(str, path))} "
                f"({type(variable).__name__}), not an nnx.Param: the planner "
                f"differentiates parameters only"
            )
    return graphdef, params, rest


def same(a: Any, b: Any) -> bool:
    """``a == b`` where equality may fail or be ambiguous (static attributes holding
    arrays): then only identity counts, which may plan again but never reuses a plan
    for another computation."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - any failing __eq__ or __bool__ means "not known equal"
        return a is b


def graph_difference(planned: Any, given: Any) -> str | None:
    """What differs between two ``nnx`` graph definitions (the planned model's and a
    model passed later), in words; None when they are equal: the same module classes,
    structure and static attributes (configuration, ``deterministic`` flags...)."""
    if same(planned, given):
        return None

    def kinds(graphdef: Any) -> list:
        return [(type(n).__name__, getattr(n, "type", None)) for n in graphdef.nodes]

    def name(kind: Any) -> str:
        return getattr(kind, "__qualname__", str(kind))

    for (_, a), (_, b) in zip(kinds(planned), kinds(given), strict=False):
        if a != b:
            return f"a {name(b)} where the planned model has a {name(a)}"
    if len(planned.nodes) != len(given.nodes):
        return f"{len(given.nodes)} graph nodes where the planned model has {len(planned.nodes)}"
    for (name, a), (_, b) in zip(planned.attributes, given.attributes, strict=False):
        va, vb = getattr(a, "value", a), getattr(b, "value", b)
        if not same(va, vb):
            return f"attribute {name!r} is {vb!r} where the planned model has {va!r}"
    return "its graph definition differs from the planned model's"


def _no_sharding(tracer: Any) -> Any:
    raise AttributeError(
        f"The 'sharding' attribute is not available on a traced array "
        f"({tracer.aval.str_short()}) while jax_exec traces the step"
    )


_SHORT = {"depth": 0, "old": None}  # _short_sharding_errors across threads
_SHORT_LOCK = threading.Lock()


@contextlib.contextmanager
def _short_sharding_errors() -> Iterator[None]:
    """While tracing, ``Tracer.sharding`` raises a short AttributeError.

    Flax probes ``getattr(value, "sharding", None)`` on every write of a whole variable
    (an RNG stream's counter at each dropout call), and JAX's property builds a message
    that says where the tracer came from by walking every equation recorded so far (a
    cost that grows with the square of the model's depth: the 24-layer GPT's trace 0.9
    -> 0.45 s, 48 layers 3.2 -> 0.9 s), then Python drops it: a property's
    AttributeError falls back to ``Tracer.__getattr__``, whose error is the one raised,
    with or without this. ``getattr``, ``hasattr`` and the message answer the same.
    Nested and concurrent traces share one replacement (the first sets it, the last
    restores JAX's property); another JAX, whose ``sharding`` is no property, is left
    as it is."""
    tracer = jax.core.Tracer
    with _SHORT_LOCK:
        if _SHORT["depth"] == 0:
            old = tracer.__dict__.get("sharding")
            _SHORT["old"] = old if isinstance(old, property) else None
            if _SHORT["old"] is not None:
                tracer.sharding = property(_no_sharding)  # type: ignore[method-assign,assignment]
        _SHORT["depth"] += 1
    try:
        yield
    finally:
        with _SHORT_LOCK:
            _SHORT["depth"] -= 1
            if _SHORT["depth"] == 0 and _SHORT["old"] is not None:
                tracer.sharding = _SHORT["old"]  # type: ignore[method-assign]


def pure_function(
    graphdef: Any, loss_fn: Callable, has_aux: bool, wrt: Any = nnx.Param
) -> Callable:
    """``f(params, rest, args) -> (loss, aux, new_params, new_rest)``: one call of
    ``loss_fn`` on the merged model, with the model state after the call split back out
    as it was split (``wrt``: the differentiated parameters)."""

    def pure(params: Any, rest: Any, args: tuple) -> tuple:
        model = nnx.merge(graphdef, params, rest)
        out = loss_fn(model, *args)
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"has_aux=True: loss_fn must return (loss, aux), got {type(out).__name__}"
                )
            loss, aux = out
        else:
            loss, aux = out, None
        _, new_params, new_rest = nnx.split(model, wrt, ...)
        return loss, aux, new_params, new_rest

    return pure


def trace(
    loss_fn: Callable, model: Any, args: tuple, *, has_aux: bool = False, wrt: Any = nnx.Param
) -> Traced:
    """Trace ``loss_fn(model, *args)`` into a :class:`Traced` (see the module docstring;
    ``wrt``: the parameters differentiated, :func:`split_model`).

    Raises:
        TypeError: not an NNX model, a loss that is not a real scalar, state whose
            structure changes during the call.
        UnsupportedModel: an operation with side effects.
    """
    graphdef, params, rest = split_model(model, wrt)
    pure = pure_function(graphdef, loss_fn, has_aux, wrt)
    traced = trace_pure(pure, params, rest, args, has_aux=has_aux, graphdef=graphdef)
    return replace(traced, wrt=wrt)


def trace_pure(
    pure: Callable, params: Any, rest: Any, args: tuple, *, has_aux: bool = False,
    graphdef: Any = None,
) -> Traced:  # fmt: skip
    """Trace ``pure(params, rest, args) -> (loss, aux, new_params, new_rest)`` (any front
    end's step: :func:`pure_function` of an NNX model, a stage list's) into a
    :class:`Traced`; ``graphdef`` identifies the model's computation (or None)."""
    with _short_sharding_errors():
        closed, shapes = jax.make_jaxpr(pure, return_shape=True)(params, rest, tuple(args))
    loss_shape, aux_shape, new_params_shape, new_rest_shape = shapes
    if not (
        isinstance(loss_shape, jax.ShapeDtypeStruct)
        and loss_shape.shape == ()
        and jax.numpy.issubdtype(loss_shape.dtype, jax.numpy.floating)
    ):
        raise TypeError(f"loss_fn(model, *args) must return a real scalar, got {loss_shape}")
    p_leaves, p_def = jax.tree_util.tree_flatten(params)
    r_leaves, r_def = jax.tree_util.tree_flatten(rest)
    a_leaves, a_def = jax.tree_util.tree_flatten(tuple(args))
    if jax.tree_util.tree_structure(new_rest_shape) != r_def:
        change = _state_change(rest, new_rest_shape)
        raise TypeError(
            f"the model's state changed structure during loss_fn ({change}): the planner "
            f"needs the same state before and after the call (values kept with Module.sow: "
            f"read them with nnx.capture(model, nnx.Intermediate) inside loss_fn, or "
            f"nnx.pop them there, and return them as aux)"
        )
    aux_leaves, aux_def = jax.tree_util.tree_flatten(aux_shape)
    builder = _Builder()
    jaxpr = closed.jaxpr
    counts = (len(p_leaves), len(r_leaves), len(a_leaves))
    inputs = [builder.new(v.aval) for v in jaxpr.invars]
    builder.globals.update(inputs)
    if len(inputs) != sum(counts):  # pragma: no cover - make_jaxpr flattens alike
        raise AssertionError("jaxpr inputs do not match the flattened arguments")
    outs = builder.inline(jaxpr, closed.consts, inputs)
    n_aux, n_par = len(aux_leaves), len(p_leaves)
    loss, aux = outs[0], tuple(outs[1 : 1 + n_aux])
    if isinstance(loss, Lit):  # a constant loss: a constant of the program
        loss = builder.new(loss_shape)
        builder.consts[loss] = np.asarray(outs[0].value, loss_shape.dtype)
        builder.globals.add(loss)
    new_params = outs[1 + n_aux : 1 + n_aux + n_par]
    new_rest = tuple(outs[1 + n_aux + n_par :])
    param_ids = tuple(inputs[: counts[0]])
    written = tuple(
        (i, new) for i, (new, old) in enumerate(zip(new_params, param_ids, strict=True))
        if new != old
    )  # fmt: skip
    if written:
        made = {vid: e for e in builder.eqns for vid in e.outs}
        through = next((made[v] for _, v in written if v in made), None)
        if through is not None and _closed(through) is not None:
            raise UnsupportedModel(
                f"the model's nnx.Param variables pass through operation {through.name} "
                f"at {through.source}, a region the planner keeps whole (nnx.cond, "
                f"nnx.while_loop...): it cannot tell they come out unchanged; keep the "
                f"parameters outside the region (close over the values it reads)"
            )
        if graphdef is None:  # a stage list's parameters: no nnx.State to write them to
            raise TypeError(
                "loss_fn writes to the model's parameters; a stage list's step needs them "
                "unchanged during the call"
            )
    for leaf in p_leaves:  # (a leaf may be a Python scalar: nnx.Param(1.5))
        dtype = jax.typeof(leaf).dtype
        if not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
            raise TypeError(
                f"an nnx.Param has dtype {dtype}: gradients need floating-point parameters"
            )
    producer = {vid: i for i, e in enumerate(builder.eqns) for vid in e.outs}
    program = Program(
        avals=tuple(builder.avals),
        eqns=tuple(builder.eqns),
        param_ids=param_ids,
        rest_ids=tuple(inputs[counts[0] : counts[0] + counts[1]]),
        arg_ids=tuple(inputs[counts[0] + counts[1] :]),
        consts=dict(builder.consts),
        loss=loss,
        aux=aux,
        new_rest=new_rest,
        treedefs=(p_def, r_def, a_def, aux_def),
        written=written,
        producer=producer,
        derived=dict(builder.derived),
        scans=tuple(builder.scans),
        weak=frozenset(i for i, v in zip(inputs, jaxpr.invars, strict=True) if v.aval.weak_type),
    )
    return Traced(program, graphdef, params, rest, pure, has_aux)


@dataclass(frozen=True)
class FlatJaxpr:
    """A closed jaxpr as flat equations over value ids (:func:`flatten`).

    Attributes:
        avals: shape and dtype of every value id.
        eqns: the equations in order.
        in_ids: value ids of the jaxpr's inputs.
        outs: its outputs (value ids or literals).
        consts: value id -> constant array.
    """

    avals: tuple
    eqns: tuple[Eqn, ...]
    in_ids: tuple[int, ...]
    outs: tuple[Ref, ...]
    consts: dict


def flatten(closed: ClosedJaxpr, inline: tuple[str, ...] = ()) -> FlatJaxpr:
    """``closed`` with nested ``jit``s (and the primitives named in ``inline``, e.g.
    ``checkpoint``) inlined and scans kept whole: a :class:`FlatJaxpr`."""
    builder = _Builder()
    builder.unroll = False
    builder.inlined = INLINED + tuple(inline)  # checkpoints only where asked for
    ins = [builder.new(v.aval) for v in closed.jaxpr.invars]
    outs = builder.inline(closed.jaxpr, closed.consts, ins)
    return FlatJaxpr(
        tuple(builder.avals), tuple(builder.eqns), tuple(ins), tuple(outs), dict(builder.consts)
    )


def read(env: dict, ref: Ref) -> Any:
    """The value of ``ref`` in ``env`` (value id -> array), literals as themselves."""
    return ref.value if isinstance(ref, Lit) else env[ref]


def evaluate(program: Program, eqns: Sequence[Eqn], env: dict) -> dict:
    """Run ``eqns`` on ``env`` (value id -> array or tracer), adding their results."""
    for eqn in eqns:
        outs = eqn.bind(*(read(env, r) for r in eqn.ins))
        for vid, val in zip(eqn.outs, outs, strict=True):
            env[vid] = val
    return env
