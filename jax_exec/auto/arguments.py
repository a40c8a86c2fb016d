"""The arguments of ``loss_fn(model, *args, **kwargs)`` as the planner traces them
(:func:`bind_arguments`): arrays and Python numbers traced, Python flags and names held
as constants of the plan, Flax graph nodes (an ``nnx.Rngs`` given to the call) traced as
their state, which comes back updated (docs/auto.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
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
    split = {i: nnx.split(node, nnx.Param, ...) for i, node in found}  # once per call
    defs = {i: parts[0] for i, parts in split.items()}
    traced = tuple(
        split[i][1:] if i in split else leaf for i, leaf in enumerate(leaves) if i not in fixed
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


def traced_arguments(planned: Any, binds_nodes: bool, args: tuple, kwargs: dict) -> tuple:
    """``(traced, bound_nodes)``: the arguments of a call as a plan's loss takes them
    (:func:`bind_arguments`; ``planned``: its key when the plan was made,
    ``binds_nodes``: whether graph nodes were bound) and whether graph nodes among them
    were bound; other Python flags, keywords or structure than planned are refused,
    naming the argument (``Plan.run``)."""
    _, traced, given, nodes = bind_arguments(_unused, args, kwargs, nodes=binds_nodes)
    if given == planned:
        return traced, bool(nodes)
    said: list[dict] = []
    for key in (planned, given):
        told = {i: repr(v) for i, v in key[1]} if key else {}
        told.update({i: f"a graph node ({_node_name(d)})" for i, d in (key[2] if key else ())})
        said.append(told)
    before, now = said
    named = [(f"args[{i}]", a) for i, a in enumerate(args)]
    named += [(key, kwargs[key]) for key in sorted(kwargs)]  # as jax flattens a dict
    is_leaf = is_node if binds_nodes else None
    ends = np.cumsum([len(jax.tree_util.tree_leaves(a, is_leaf=is_leaf)) for _, a in named])
    for i in sorted(set(before) | set(now)):
        if before.get(i) != now.get(i):
            where = named[int(np.searchsorted(ends, i, side="right"))][0]
            raise ValueError(
                f"{where} holds {now.get(i, 'a traced value')} where the plan was made with "
                f"{before.get(i, 'a traced value')} (a Python flag is a constant of the "
                f"plan: plan again for another value)"
            )
    raise ValueError(
        "args: their structure (keywords, graph nodes) differs from the planned arguments'"
    )


def _node_name(graphdef: Any) -> str:
    """The class of the graph node a graph definition describes, for messages."""
    try:
        return graphdef.nodes[0].type.__name__
    except (AttributeError, IndexError, TypeError):
        return "Flax"


def _unused(*_: Any) -> None:  # pragma: no cover - traced_arguments binds, calls nothing
    raise AssertionError
