"""The arguments of ``loss_fn(model, *args, **kwargs)`` as the planner traces them
(:func:`bind_arguments`): arrays and Python numbers traced, Python flags and names held
as constants of the plan, Flax graph nodes (an ``nnx.Rngs`` given to the call) traced as
their state, which comes back updated (docs/auto.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx


def _is_static(leaf: Any) -> bool:
    """A Python flag or name among the arguments (``train=True``, ``mode="mean"``): held
    as a constant of the plan, as an eager ``nnx.value_and_grad`` sees it (Python numbers
    stay traced, as ``jax.jit`` traces them: a step counter must not replan every step)."""
    return isinstance(leaf, bool | str)


def is_node(leaf: Any) -> bool:
    """A Flax graph node (a module, an ``nnx.Rngs``, a variable)."""
    return nnx.graph.is_graph_node(leaf)


def bind_arguments(
    loss_fn: Callable, args: tuple, kwargs: dict, has_aux: bool = False, nodes: bool = True
) -> tuple[Callable, tuple, Any, tuple]:
    """``(fn, traced, key, nodes)``: ``fn(model, *traced)`` calls ``loss_fn(model, *args,
    **kwargs)`` with the arguments' arrays and Python numbers as ``traced`` and their
    flags and names (:func:`_is_static`) as constants; ``key`` says what ``fn`` holds
    (the arguments' structure and constants). ``nodes``: the Flax graph nodes among the
    arguments (an ``nnx.Rngs`` given to the call, another module), traced as their
    state; their state other than ``nnx.Param`` comes back updated, as
    ``nnx.value_and_grad`` updates it: ``fn`` then returns ``(loss, (aux, states))``
    (``aux`` None without ``has_aux``), one state per node. Without keyword arguments,
    constants or nodes, ``fn`` is ``loss_fn``. ``nodes=False``: graph nodes are traced
    as the pytrees they are and nothing comes back (``plan``: ``Plan.run`` is pure)."""
    is_leaf = is_node if nodes else None
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)), is_leaf=is_leaf)
    static = tuple((i, leaf) for i, leaf in enumerate(leaves) if _is_static(leaf))
    found = tuple((i, leaf) for i, leaf in enumerate(leaves) if nodes and is_node(leaf))
    if not kwargs and not static and not found:
        return loss_fn, tuple(args), None, ()
    fixed = dict(static)
    defs = {i: nnx.split(node, nnx.Param, ...)[0] for i, node in found}
    traced = tuple(
        nnx.split(leaf, nnx.Param, ...)[1:] if i in defs else leaf
        for i, leaf in enumerate(leaves)
        if i not in fixed
    )

    def fn(model: Any, *values: Any) -> Any:
        it = iter(values)
        full = [fixed[i] if i in fixed else next(it) for i in range(len(leaves))]
        given = {i: full[i] for i in defs}
        for i in defs:
            full[i] = nnx.merge(defs[i], *full[i])
        a, kw = jax.tree_util.tree_unflatten(treedef, full)
        out = loss_fn(model, *a, **kw)
        if not defs:
            return out
        states = []
        for i, (params, _) in given.items():
            _, new_params, new_rest = nnx.split(full[i], nnx.Param, ...)
            if any(x is not y for x, y in zip(jax.tree.leaves(new_params),
                                              jax.tree.leaves(params), strict=True)):  # fmt: skip
                raise TypeError(f"loss_fn writes to the nnx.Param variables of argument "
                                f"{type(full[i]).__name__}: the planner needs them unchanged "
                                f"during the call")  # fmt: skip
            states.append(new_rest)
        loss, aux = out if has_aux else (out, None)
        return loss, (aux, tuple(states))

    key = (treedef, static, tuple((i, defs[i]) for i in defs))
    return fn, traced, key, tuple(node for _, node in found)


def check_not_in_model(model: Any, nodes: tuple) -> None:
    """Refuse an argument that is also part of the model (its state would be traced
    twice, and updated twice)."""
    inside = {id(node) for _, node in nnx.iter_graph(model)}
    for node in nodes:
        if id(node) in inside:
            raise ValueError(
                f"an argument ({type(node).__name__}) is also part of the model: pass it "
                f"once (the model's own, or as an argument)"
            )
