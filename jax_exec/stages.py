"""Stages: a uniform, pure view of the layers a user hands in (Flax NNX, or Linen).

A stage is one link of the chain: a pure function ``apply(params, rest, a) -> a_next``
of its trainable parameters ``params``, its other state ``rest`` (held constant) and
one input array. NNX modules are split with ``nnx.split(layer, nnx.Param, ...)``;
a Linen module comes as a pair ``(module, variables)`` with ``variables["params"]``.
Stages must be pure: layers that mutate state while running (batch-norm statistics
in training mode, dropout drawing from ``nnx.Rngs``) are not supported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx


@dataclass(frozen=True)
class Stage:
    """One layer in pure form.

    Attributes:
        name: display name, e.g. ``"3:Linear"``.
        params: trainable parameters (an ``nnx.State`` for NNX, a dict for Linen).
        rest: the non-trainable state, passed unchanged to ``apply``.
        apply: ``(params, rest, a) -> a_next``, pure.
        key: hashable identity of the computation (graph definition), used to reuse
            compiled kernels between calls.
        kind: ``"nnx"`` or ``"linen"``.
    """

    name: str
    params: Any
    rest: Any
    apply: Callable[[Any, Any, jax.Array], jax.Array]
    key: Any
    kind: str


def _nnx_stage(index: int, layer: nnx.Module) -> Stage:
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def apply(p: Any, r: Any, a: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p, r)(a)

    name = f"{index}:{type(layer).__name__}"
    return Stage(name, params, rest, apply, ("nnx", graphdef), "nnx")


def _linen_stage(index: int, module: Any, variables: Any) -> Stage:
    if not isinstance(variables, dict) or "params" not in variables:
        raise TypeError(
            f"layer {index}: a Linen layer is given as (module, variables) with "
            f"variables['params']; got variables of type {type(variables).__name__}"
        )
    params = variables["params"]
    rest = {k: v for k, v in variables.items() if k != "params"}

    def apply(p: Any, r: Any, a: jax.Array) -> jax.Array:
        return module.apply({"params": p, **r}, a)

    name = f"{index}:{type(module).__name__}"
    return Stage(name, params, rest, apply, ("linen", id(module), module), "linen")


def as_stages(layers: Sequence[Any]) -> list[Stage]:
    """Turn ``layers`` (NNX modules, or Linen ``(module, variables)`` pairs) into stages.

    Parameters are read now: call again after the model was updated.
    """
    if isinstance(layers, nnx.Module) and hasattr(layers, "layers"):
        layers = layers.layers  # an nnx.Sequential
    try:
        items = list(layers)
    except TypeError:
        raise TypeError(
            f"layers must be a sequence of Flax modules, got {type(layers).__name__}"
        ) from None
    if not items:
        raise ValueError("layers is empty: a chain needs at least one stage")
    stages = []
    for k, layer in enumerate(items):
        if isinstance(layer, nnx.Module):
            stages.append(_nnx_stage(k, layer))
        elif isinstance(layer, tuple) and len(layer) == 2 and hasattr(layer[0], "apply"):
            stages.append(_linen_stage(k, *layer))
        else:
            raise TypeError(
                f"layer {k}: expected an nnx.Module or a Linen (module, variables) pair, "
                f"got {type(layer).__name__}"
            )
    return stages


def activation_specs(stages: Sequence[Stage], x: Any) -> list[jax.ShapeDtypeStruct]:
    """Shapes of a_0 .. a_L, checking that every stage maps one array to one array."""
    a = as_spec("the input x", x)
    specs = [a]
    for stage in stages:
        out = jax.eval_shape(stage.apply, stage.params, stage.rest, a)
        a = as_spec(f"layer {stage.name}'s output", out)
        specs.append(a)
    return specs


def as_spec(what: str, value: Any) -> jax.ShapeDtypeStruct:
    """``value`` as a ShapeDtypeStruct; a clear TypeError when it is not an array."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, dict):
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    raise TypeError(
        f"{what} is a {type(value).__name__}, not an array: every layer must map one "
        f"array to one array (wrap layers that return tuples or dicts)"
    )


def check_loss(loss_fn: Callable, out: jax.ShapeDtypeStruct, y: Any) -> None:
    """The loss must map (a_L, y) to a real scalar."""
    value = jax.eval_shape(loss_fn, out, y)
    if not isinstance(value, jax.ShapeDtypeStruct) or value.shape != ():
        raise TypeError(f"loss_fn(out, y) must return a scalar array, got {value}")


def spec_bytes(spec: jax.ShapeDtypeStruct) -> int:
    """Bytes of an array of this shape and dtype."""
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n * spec.dtype.itemsize
