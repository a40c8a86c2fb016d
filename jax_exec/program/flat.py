"""The flat program: a traced ``loss_fn(model, *args)`` as one list of equations over
integer value ids (docs/auto.md, "Tracing"), which every part of the planner and every
executor reads. :class:`Program` is the model's forward computation
(:func:`jax_exec.program.trace.trace` makes it), :class:`FlatJaxpr` any closed jaxpr
flattened alike (:func:`jax_exec.program.flatten.flatten`); :func:`evaluate` runs
equations on values; :func:`aval_bytes` is how the planner and the op-by-op runtime
count a value's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from flax import nnx
from jax.extend.core import ClosedJaxpr, Jaxpr


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
