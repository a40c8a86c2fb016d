"""Stages: a uniform, pure view of the layers a user hands in (Flax NNX, or Linen).

A stage is one link of the chain: a pure function ``apply(params, rest, a) -> a_next``
of its trainable parameters ``params``, its other state ``rest`` (read-only) and one
input array. What is accepted as ``layers`` (anything else is refused, naming it):

- a list or tuple (or ``nnx.List``) whose items are NNX modules, Linen pairs
  ``(module, variables)`` with ``variables["params"]``, or functions of JAX or Flax
  (``jax.nn.relu``, ``jnp.tanh``: stages without parameters);
- an ``nnx.Sequential`` whose ``__call__`` is not overridden (its ``layers``).

A module with its own ``__call__`` is never guessed into a chain: the splitter cannot
see what that ``__call__`` does besides calling its layers.

NNX modules are split once with ``nnx.split(layer, nnx.Param, ...)``; the states hold
the module's own ``nnx.Variable`` objects, so reading them (flattening) gives the
values current at that moment. Stages must be pure: a layer that changes its state
while running (batch statistics in training mode, dropout drawing from ``nnx.Rngs``,
``sow``) is refused when it is first traced, naming the layer and the variable (the
state would otherwise be frozen). A parameter object read by several layers (tied
weights) is handled by :mod:`jax_exec.sharing`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from jax_exec.sharing import Sharing, find_sharing


@dataclass(frozen=True)
class Stage:
    """One layer in pure form.

    Attributes:
        name: display name, e.g. ``"3:Linear"``.
        params: every trainable parameter the layer reads (an ``nnx.State`` of the
            layer's own ``nnx.Param`` objects for NNX, a dict for Linen), shared
            ones included.
        rest: the non-trainable state, read-only, passed to ``apply``.
        apply: ``(params, rest, a) -> a_next``, pure.
        key: hashable identity of the computation (graph definition), used to reuse
            compiled kernels between calls.
        kind: ``"nnx"``, ``"linen"``, ``"function"``, or ``"program"`` (a slice of a
            traced model, :mod:`jax_exec.pipeline.traced`: its input and output may be
            tuples of floating-point arrays).
    """

    name: str
    params: Any
    rest: Any
    apply: Callable[[Any, Any, jax.Array], jax.Array]
    key: Any
    kind: str


ACCEPTED = (
    "layers must be a list or tuple of layers (NNX modules, Linen (module, variables) "
    "pairs, or JAX/Flax functions such as jax.nn.relu), or an nnx.Sequential whose "
    "__call__ is not overridden"
)


def _defines_call(module: Any) -> bool:
    return any("__call__" in vars(cls) for cls in type(module).__mro__[:-1])


def layer_items(layers: Any) -> list:
    """The items of ``layers`` as a list, or a TypeError saying what is accepted."""
    if isinstance(layers, nnx.Sequential):
        if type(layers).__call__ is not nnx.Sequential.__call__:
            raise TypeError(
                f"layers is a {type(layers).__name__}, an nnx.Sequential that overrides "
                f"__call__: the stages cannot be read from it. {ACCEPTED}"
            )
        return list(layers.layers)
    if isinstance(layers, nnx.Module):
        if isinstance(layers, Sequence) and not _defines_call(layers):
            return list(layers)  # an nnx.List
        raise TypeError(
            f"layers is a {type(layers).__name__} (an nnx.Module with its own __call__): "
            f"its __call__ may do more than apply layers in order, so it is not split "
            f"into stages. Pass the stages it runs as a list, e.g. [model.embed, "
            f"*model.blocks, model.head], when __call__ does exactly that. {ACCEPTED}"
        )
    if isinstance(layers, list | tuple):
        return list(layers)
    if isinstance(layers, dict):
        raise TypeError(
            "layers is a dict: a DAG model of named nodes goes to jax_exec.profile_graph "
            f"/ run_graph. {ACCEPTED}"
        )
    raise TypeError(f"layers is a {type(layers).__name__}. {ACCEPTED}")


def _state_values(module: nnx.Module) -> dict:
    return {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(module))}


def _refuse_state_change(name: str, before: dict, after: dict, module: nnx.Module) -> None:
    """A TypeError naming the first variable that ``module``'s call created or changed."""
    for path, value in after.items():
        if path in before and value is before[path]:
            continue
        flat = nnx.to_flat_state(nnx.state(module))
        kind = next(type(v).__name__ for p, v in flat if p == path)
        what = "changes" if path in before else "creates"
        where = ".".join(str(p) for p in path)
        raise TypeError(
            f"layer {name} {what} its state while running: {where} ({kind}). A stage "
            f"runs as a pure function, so this state would stay frozen (the same dropout "
            f"mask every step, batch statistics never updated); stateful layers are not "
            f"supported by the stage list. Put them in evaluation mode (model.eval(), "
            f"deterministic=True, use_running_average=True) or remove them."
        )


def pure_apply(name: str, graphdef: Any) -> Callable[..., Any]:
    """``apply(params, rest, *inputs)`` of an NNX module split into ``graphdef``.

    Refuses (TypeError naming ``name`` and the variable) a module that changes its
    state while running; used by the stage list and usable by any executor.
    """

    def apply(p: Any, r: Any, *inputs: Any) -> Any:
        # copy: an eager call must not write into the user's module before refusing it.
        module = nnx.merge(graphdef, p, r, copy=True)
        before = _state_values(module)
        out = module(*inputs)
        _refuse_state_change(name, before, _state_values(module), module)
        return out

    return apply


def _nnx_stage(index: int, layer: nnx.Module) -> Stage:
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    name = f"{index}:{type(layer).__name__}"
    return Stage(name, params, rest, pure_apply(name, graphdef), ("nnx", graphdef), "nnx")


def _linen_stage(index: int, module: Any, variables: Any) -> Stage:
    if not isinstance(variables, dict) or "params" not in variables:
        raise TypeError(
            f"layer {index}: a Linen layer is given as (module, variables) with "
            f"variables['params']; got variables of type {type(variables).__name__}"
        )
    params = variables["params"]
    rest = {k: v for k, v in variables.items() if k != "params"}

    def apply(p: Any, r: Any, a: jax.Array) -> jax.Array:
        # Linen itself refuses writes to an immutable collection and dropout without rngs.
        return module.apply({"params": p, **r}, a)

    name = f"{index}:{type(module).__name__}"
    return Stage(name, params, rest, apply, ("linen", id(module), module), "linen")


_JITTED = type(jax.jit(lambda a: a))


def _is_library_function(obj: Any) -> bool:
    """A function of JAX or Flax (pure, no hidden parameters), e.g. ``jax.nn.relu``."""
    if not (inspect.isfunction(obj) or isinstance(obj, jax.custom_jvp | jax.custom_vjp | _JITTED)):
        return False
    return (getattr(obj, "__module__", None) or "").split(".")[0] in ("jax", "flax")


def _function_stage(index: int, fn: Callable) -> Stage:
    def apply(p: Any, r: Any, a: jax.Array) -> jax.Array:
        return fn(a)

    name = f"{index}:{getattr(fn, '__name__', type(fn).__name__)}"
    return Stage(name, nnx.State({}), nnx.State({}), apply, ("function", fn), "function")


def _stage(k: int, layer: Any) -> Stage:
    if isinstance(layer, nnx.Module):
        return _nnx_stage(k, layer)
    if isinstance(layer, tuple) and len(layer) == 2 and hasattr(layer[0], "apply"):
        return _linen_stage(k, *layer)
    if _is_library_function(layer):
        return _function_stage(k, layer)
    if isinstance(layer, nn.Module):
        why = "a Linen module comes with its variables, as a pair (module, variables)"
    elif callable(layer):
        why = (
            "a function of your own may hold parameters or modules in its closure that "
            "the splitter cannot see: wrap it in an nnx.Module"
        )
    else:
        why = "expected an nnx.Module, a Linen (module, variables) pair or a JAX function"
    what = getattr(layer, "__qualname__", None) or repr(layer)[:60]
    raise TypeError(f"layer {k}: got {type(layer).__name__} {what}: {why}")


class LayerWatch:
    """Detects, cheaply (a fraction of a millisecond), a change of the layers' structure.

    Records, for every graph node (module, ``nnx.List``) of every NNX layer, the
    objects its attributes point to, and for Linen layers the tree structure and shapes
    of their variables. ``model.eval()``, reassigning a submodule or an ``nnx.Variable``
    object, or new Linen shapes are seen; new *values* of existing Variables are not a
    change (they are read at every call).
    """

    def __init__(self, layers: Any) -> None:
        items = layer_items(layers)
        self.layers, self.items = layers, tuple(items)
        self.nodes: list[tuple[Any, dict]] = []
        self.linen: list[tuple[dict, Any]] = []
        for item in items:
            if isinstance(item, nnx.Module):
                for _, node in nnx.iter_graph(item):
                    if isinstance(node, nnx.Module):
                        self.nodes.append((node, _attributes(node)))
            elif isinstance(item, tuple):
                self.linen.append((item[1], _shapes(item[1])))

    def changed(self) -> bool:
        """Whether the layers' structure changed since this watch was made."""
        try:
            items = layer_items(self.layers)
        except TypeError:
            return True
        if len(items) != len(self.items) or any(
            a is not b for a, b in zip(items, self.items, strict=True)
        ):
            return True
        for node, attrs in self.nodes:
            now = _attributes(node)
            if len(now) != len(attrs) or any(now.get(k, now) is not v for k, v in attrs.items()):
                return True
        return any(_shapes(variables) != shapes for variables, shapes in self.linen)


def _attributes(node: nnx.Module) -> dict:
    # Flax transforms (nnx.jit, nnx.value_and_grad) replace the trace bookkeeping.
    return {k: v for k, v in vars(node).items() if k != "_pytree__state"}


def _shapes(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((getattr(x, "shape", None), getattr(x, "dtype", None)) for x in leaves)


@dataclass(frozen=True)
class StageList:
    """The layers split once: their stages and shared parameters.

    Attributes:
        stages: one :class:`Stage` per layer.
        sharing: which parameter objects several layers read (:mod:`jax_exec.sharing`).
        items: the layers, as given.

    ``params()`` and ``state()`` read the values current when called (for NNX the
    states hold the module's own Variables; Linen variables are read again from the
    pairs). A change of the structure (``model.eval()``, a reassigned submodule) is
    not followed: split again (:class:`LayerWatch` says when).
    """

    stages: tuple[Stage, ...]
    sharing: Sharing
    items: tuple

    def params(self) -> list:
        """Per layer, the parameters it owns (a shared one only in its first layer)."""
        full = [
            item[1]["params"] if s.kind == "linen" else s.params
            for s, item in zip(self.stages, self.items, strict=True)
        ]
        return self.sharing.own(full)

    def state(self) -> list:
        """Per layer, its non-trainable state (read-only)."""
        return [
            {k: v for k, v in item[1].items() if k != "params"} if s.kind == "linen" else s.rest
            for s, item in zip(self.stages, self.items, strict=True)
        ]

    def expand(self, params: Sequence[Any]) -> list:
        """Per layer, every parameter it reads, from :meth:`params`-shaped ``params``."""
        return self.sharing.expand(params)

    def fold(self, grads: Sequence[Any]) -> list:
        """Per-layer gradients of every parameter read -> gradients of owned ones (summed)."""
        return self.sharing.fold(grads)


def split_layers(layers: Any) -> StageList:
    """Split ``layers`` (see the module doc) into a :class:`StageList`, or a TypeError."""
    items = layer_items(layers)
    if not items:
        raise ValueError("layers is empty: a chain needs at least one stage")
    stages = tuple(_stage(k, layer) for k, layer in enumerate(items))
    return StageList(stages, find_sharing(stages), tuple(items))


def as_stages(layers: Any) -> list[Stage]:
    """Turn ``layers`` (see the module doc) into stages, one parameter pytree per layer.

    Refuses layers that share a parameter object (tied weights): with one parameter
    pytree per layer, the shared parameter would get one partial gradient per layer
    and its copies would be trained apart. ``jax_exec.profile``, ``run``, ``lower``
    and ``value_and_grad`` handle such models (the parameter is held once).
    """
    model = split_layers(layers)
    if model.sharing.shared:
        raise TypeError(
            f"{model.sharing.describe()}: as_stages gives one parameter pytree per layer, "
            f"which would train the copies apart; jax_exec.profile / run / lower / "
            f"value_and_grad hold a shared parameter once and sum its gradients"
        )
    return list(model.stages)


def output_spec(stage: Stage, value: Any) -> jax.ShapeDtypeStruct:
    """A stage output's shape: one floating-point array, or a clear TypeError."""
    spec = as_spec(f"layer {stage.name}'s output", value)
    if not jnp.issubdtype(spec.dtype, jnp.inexact):
        raise TypeError(
            f"layer {stage.name}'s output is {spec.dtype}: a stage's output must be a "
            f"floating-point array (the gradient flows back through it); only the input "
            f"x may hold integers (token ids)"
        )
    return spec


def activation_specs(stages: Sequence[Stage], x: Any) -> list[jax.ShapeDtypeStruct]:
    """Shapes of a_0 .. a_L, checking that every stage maps one array to one array."""
    a = as_spec("the input x", x)
    specs = [a]
    for stage in stages:
        a = output_spec(stage, jax.eval_shape(stage.apply, stage.params, stage.rest, a))
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


def spec_bytes(spec: Any) -> int:
    """Bytes of an array of this shape and dtype (of every leaf of a pytree of them:
    a traced model's stages carry tuples, :mod:`jax_exec.pipeline.traced`)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(spec):
        n = 1
        for d in leaf.shape:
            n *= int(d)
        total += n * leaf.dtype.itemsize
    return total


def tree_spec(what: str, value: Any) -> Any:
    """``value`` (an array, or a tuple of arrays) as ShapeDtypeStructs alike; a clear
    TypeError for anything else (:func:`as_spec` on each array)."""
    if isinstance(value, tuple):
        return tuple(as_spec(f"{what}[{k}]", v) for k, v in enumerate(value))
    return as_spec(what, value)


def plain_loss(stages: Sequence[Stage], loss_fn: Callable) -> Callable[..., jax.Array]:
    """``loss(params, x, y)``: the stages applied in order (``params``: one pytree per
    stage), then ``loss_fn``. No schedule: ``jax.value_and_grad`` of it is the plain
    step every executor's loss and gradients are checked against."""

    def loss(params: Sequence[Any], x: Any, y: Any) -> jax.Array:
        a = x
        for stage, p in zip(stages, params, strict=True):
            a = stage.apply(p, stage.rest, a)
        return loss_fn(a, y)

    return loss
