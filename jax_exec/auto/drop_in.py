"""``value_and_grad``: ``nnx.value_and_grad`` following a plan made on the first call
per model and input shapes (docs/auto.md)."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_exec.auto.arguments import bind_arguments, check_not_in_model
from jax_exec.auto.methods import check_plan_options, solver_of
from jax_exec.auto.plan import plan
from jax_exec.program.placement import spread
from jax_exec.program.trace import same, split_model


def _shape_key(tree: Any) -> tuple:
    """Shapes and dtypes of ``tree``'s leaves, and the shardings of those sharded over
    several devices (a plan of sharded arrays is per device; under jit, where arrays
    have no concrete sharding, a plan is made for one device)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    spread_ids = {id(x) for x in spread(leaves)}
    shapes = tuple(
        (tuple(getattr(x, "shape", ())), _dtype(x), x.sharding if id(x) in spread_ids else None)
        for x in leaves
    )  # fmt: skip
    return (treedef, shapes)


def _dtype(x: Any) -> str:
    """An array's dtype; a Python number's as JAX traces it (an eager call and one under
    jit share a plan)."""
    if hasattr(x, "dtype"):
        return str(x.dtype)
    return str(jnp.result_type(x)) if isinstance(x, int | float | complex) else str(type(x))


class PlanCache:
    """Plans by what determines them: the model's graph definition (its classes,
    structure and static attributes, compared by equality: configurations held as
    unhashable dataclasses or lists are fine) and the shapes and dtypes of its state and
    of the arguments (hashed)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, list[tuple[Any, Any]]] = {}

    def get(self, graphdef: Any, key: tuple) -> Any:
        for planned, value in self.entries.get(key, ()):
            if same(planned, graphdef):
                return value
        return None

    def put(self, graphdef: Any, key: tuple, value: Any) -> None:
        self.entries.setdefault(key, []).append((graphdef, value))

    def values(self) -> list:
        return [value for entries in self.entries.values() for _, value in entries]

    def __len__(self) -> int:
        return sum(len(e) for e in self.entries.values())


def _changed_state_only(step: Callable) -> Callable:
    """``step`` (``jax.value_and_grad`` of a lowered plan) returning only the state
    entries the call changed (and the parameters it wrote): an unchanged one comes back
    as the very tracer passed in (checked while tracing), and a jitted step would return
    a copy of it (frozen buffers, RoPE tables, statistics in eval mode) where
    ``nnx.update`` needs nothing."""

    def changed(params: Any, rest: Any, args: tuple) -> Any:
        (loss, (aux, new_rest)), grads = step(params, rest, args)
        before = {path: jax.tree.leaves(old) for path, old in nnx.to_flat_state(rest)}

        def unchanged(path: tuple, new: Any) -> bool:
            old, now = before.get(path), jax.tree.leaves(new)
            return old is not None and len(old) == len(now) and all(map(operator.is_, old, now))

        kept = [(path, new) for path, new in nnx.to_flat_state(new_rest)  # (and written
                if not unchanged(path, new)]  # parameters) # fmt: skip
        return (loss, (aux, nnx.from_flat_state(kept))), grads

    return changed


PLAN_KEYWORDS = frozenset(inspect.signature(plan).parameters) - {"loss_fn", "model", "args"}


def _wrt_of(argnums: Any) -> Any:
    """The parameter filter that ``argnums`` differentiates (``0``: every ``nnx.Param``;
    ``nnx.DiffState(0, filter)``: those the filter selects); other arguments are refused."""
    if isinstance(argnums, nnx.DiffState):
        if argnums.argnum != 0:
            raise ValueError(
                f"argnums = {argnums!r}: value_and_grad differentiates the model (argument 0) only"
            )
        return argnums.filter
    if isinstance(argnums, int) and not isinstance(argnums, bool) and argnums == 0:
        return nnx.Param
    raise ValueError(
        f"argnums = {argnums!r}: value_and_grad differentiates the model (argument 0) "
        f"only: give 0 or nnx.DiffState(0, filter) (e.g. nnx.LoRAParam)"
    )


def value_and_grad(
    loss_fn: Callable,
    argnums: int | nnx.DiffState = 0,
    *,
    budget: int | str,
    method: str = "auto",
    has_aux: bool = False,
    **plan_options: Any,
) -> Callable:
    """``f(model, *args, **kwargs) -> (loss, grads)`` (``((loss, aux), grads)`` with
    ``has_aux``), like ``nnx.value_and_grad(loss_fn, has_aux=has_aux)``, following a plan
    made on the first call for each model (its graph definition: classes, structure,
    static attributes) and shapes, dtypes and shardings of its state and the arguments
    (like ``jax.jit``'s cache; under jit, where arrays have no concrete sharding, a plan
    for one device; eagerly, sharded arrays are planned per device, docs/auto.md).
    Python bools and strings among the arguments (``train=True``) are constants of the
    plan, one plan per value, as an eager call sees them; Python numbers are traced, as
    ``jax.jit`` traces them (bind one that must be concrete with ``functools.partial``).
    ``argnums``: ``0`` (every ``nnx.Param`` of the model) or ``nnx.DiffState(0,
    filter)``, as ``nnx.value_and_grad`` takes it (``nnx.LoRAParam``: the other
    parameters are read and not differentiated, and get no gradient).
    Flax graph nodes among the arguments (an ``nnx.Rngs`` for ``model(x, rngs=rngs)``, a
    teacher module) are traced as their state, not differentiated, and their state
    other than ``nnx.Param`` is updated in place as ``nnx.value_and_grad`` updates it.
    ``f.plans`` holds them, ``f.plan`` is the last one used. The model's state
    (BatchNorm statistics, RNG counters, and the weights that ``nnx.WeightNorm`` or
    ``nnx.SpectralNorm`` write) is updated in place as the plain call would.
    Called eagerly, the step runs compiled (one ``jax.jit`` per plan); it composes with
    ``nnx.jit`` / ``jax.jit`` and optax. Plans are made as :func:`plan` makes them
    (``exact=True`` unless ``plan_options`` say otherwise), so a budget means the same
    bytes here and there.
    """
    solver = solver_of(method)
    wrt = _wrt_of(argnums)
    if "wrt" in plan_options:
        raise TypeError(
            f"wrt = {plan_options['wrt']!r}: value_and_grad takes argnums=nnx.DiffState(0, "
            f"filter), as nnx.value_and_grad does"
        )
    solver_options = {k: v for k, v in plan_options.items() if k not in PLAN_KEYWORDS}
    check_plan_options(solver, solver_options)  # plan's own: plan checks them
    if solver[0] == "graph":
        raise ValueError(
            f"method = {method!r}: value_and_grad runs the compiled step, which follows "
            f"block-chain schedules; a graph method's schedule runs op by op (plan(...).run)"
        )
    plans = PlanCache()

    def f(model: Any, *args: Any, **kwargs: Any):
        fn, args, bound, nodes = bind_arguments(loss_fn, args, kwargs, has_aux)
        graphdef, params, rest = split_model(model, wrt, f"argnums = {argnums!r}")
        if nodes:
            check_not_in_model(model, nodes)
        shapes = (_shape_key(params), _shape_key(rest), _shape_key(args))
        key = (*shapes, bound[:2] if bound else None)
        defs = (graphdef, bound[2] if bound else ())  # compared by equality (PlanCache)
        found = plans.get(defs, key)
        if found is None:
            p = plan(fn, model, *args, budget=budget, method=method,
                     has_aux=has_aux or bool(nodes), wrt=wrt, **plan_options)  # fmt: skip
            p.arguments, p.binds_nodes = bound, True  # f.plan.run takes the call's
            found = (p, jax.jit(_changed_state_only(jax.value_and_grad(p.lowered(), has_aux=True))))
            plans.put(defs, key, found)
        f.plan, step = found
        (loss, (aux, new_rest)), grads = step(params, rest, args)
        nnx.update(model, new_rest)
        if nodes:  # the arguments' state (an nnx.Rngs' counters), as the plain call leaves it
            aux, states = aux
            for node, state in zip(nodes, states, strict=True):
                nnx.update(node, state)
        return ((loss, aux), grads) if has_aux else (loss, grads)

    def summary() -> str:
        """The last plan's :meth:`~jax_exec.auto.plan.Plan.summary` (none before the
        first call)."""
        if f.plan is None:
            return "no plan yet: it is made at the first call"
        return f.plan.summary()

    f.plans = plans  # type: ignore[attr-defined]
    f.plan = None  # type: ignore[attr-defined]
    f.summary = summary  # type: ignore[attr-defined]
    return f


def grad(
    loss_fn: Callable,
    argnums: int | nnx.DiffState = 0,
    *,
    budget: int | str,
    method: str = "auto",
    has_aux: bool = False,
    **plan_options: Any,
) -> Callable:
    """``f(model, *args, **kwargs) -> grads`` (``(grads, aux)`` with ``has_aux``), like
    ``nnx.grad(loss_fn, argnums, has_aux=has_aux)``: :func:`value_and_grad` without the
    loss (the same plans, ``f.plans``, ``f.plan``, ``f.summary``)."""
    both = value_and_grad(loss_fn, argnums, budget=budget, method=method, has_aux=has_aux,
                          **plan_options)  # fmt: skip

    def f(model: Any, *args: Any, **kwargs: Any):
        out, grads = both(model, *args, **kwargs)
        f.plan = both.plan
        return (grads, out[1]) if has_aux else grads

    f.plans, f.plan, f.summary = both.plans, None, both.summary  # type: ignore[attr-defined]
    return f
