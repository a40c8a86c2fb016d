"""Trace ``loss_fn(model, *args)`` into a flat forward program (docs/auto.md, "Tracing").

The model is split (``nnx.split(model, nnx.Param, ...)``, or another filter of its
parameters: ``nnx.LoRAParam``) into its differentiated parameters and the rest of its
state; :func:`trace` builds the pure function
``f(params, rest, args) -> (loss, aux, new_rest)`` that merges the model, calls
``loss_fn`` and splits the updated state back, and traces it with ``jax.make_jaxpr``.
The jaxpr is flattened (:mod:`jax_exec.program.flatten`) into a
:class:`~jax_exec.program.flat.Program`: one list of equations over integer value ids,
with every nested ``jit`` and the model's own ``jax.checkpoint`` regions inlined (their
equations become the program's, so cuts and options can fall inside them).
``custom_jvp`` / ``custom_vjp`` calls, ``cond`` and other higher-order primitives stay
single equations (opaque: JAX differentiates them as a whole). A ``scan``
(``nnx.scan``, ``lax.scan``) is unrolled into its iterations (a chain of identical
blocks): its stacked global inputs (a scanned stack's parameters) become per-iteration
slices, globals too (``Program.derived``). Equations with side effects are refused with
an error naming the primitive and the user code it came from; debug callbacks
(``jax.debug.print``) are left out of the planned step with a warning. This module also
says whether a model passed later is the planned one (:func:`graph_difference`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np
from flax import nnx

from jax_exec.program.flat import Lit, Program
from jax_exec.program.flatten import Builder, UnsupportedModel, closed_jaxpr


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
                got = (
                    f"an array of shape {out.shape}"
                    if isinstance(out, jax.Array)
                    else f"a {type(out).__name__}"
                    if not isinstance(out, tuple)
                    else f"a tuple of {len(out)}"
                )  # (under tracing, the loss alone is a tracer: say what it is)
                raise TypeError(f"has_aux=True: loss_fn must return (loss, aux), got {got}")
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
    builder = Builder()
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
        if through is not None and closed_jaxpr(through) is not None:
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
