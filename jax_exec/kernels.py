"""The one kernel builder: compiled kernels of an n-input node (a chain stage is a
1-input node), shared by the profilers and the op-by-op runtimes.

A node has ``params``, ``rest`` (other state), ``key`` (hashable identity of its
computation) and ``apply(params, rest, *ins) -> out`` (one array). For input shapes
``ins`` its kernels are:

- ``fwd(params, rest, ins) -> out``: the plain forward (chain ops ``F_ck``, ``F_n``;
  graph node v);
- ``rec(params, rest, ins) -> (out, new)``: the recording forward (``F_all``). It runs
  ``jax.vjp`` and returns only the residual arrays that are *new*: not an input, not a
  parameter, not the output itself (those are held elsewhere already), each once.
  ``abar[k+1]`` is exactly ``(a_{k+1}, *new)``;
- ``res(params, rest, ins) -> new``: the new residuals only (graph node ``R{v}``);
- ``bwd(params, rest, ins, out, new, cots) -> (d_params, d_ins)``: sums the cotangents
  ``cots`` (one per user of the output), rebuilds the ``jax.vjp`` closure from the
  pieces (the :class:`Recipe`) and applies it, so the backward never recomputes the
  forward.

The loss kernel is ``loss(out, y) -> (loss, d_out)``. Every kernel is compiled ahead of
time (:func:`compile_kernel`); its temporary bytes come from ``memory_analysis()`` and
its FLOPs from ``cost_analysis()``. Kernels are cached by the node's computation and
shapes, so profiling, running and re-running a model compiles each node once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend.core import Literal

from jax_exec.program.compiled import Kernel, compile_kernel
from jax_exec.stages.split import Stage, as_spec, check_loss, output_spec, spec_bytes, tree_spec


@dataclass(frozen=True)
class Recipe:
    """Where each leaf of a stage's ``jax.vjp`` closure comes from.

    Attributes:
        treedef: tree structure of the closure.
        sources: per leaf, ``("param", j)`` (j-th parameter leaf), ``("rest", j)``
            (j-th leaf of the other state), ``("in", 0)`` (the
            stage input), ``("out", 0)`` (the stage output), ``("new", m)`` (m-th new
            residual returned by ``rec``) or ``("const", m)`` (m-th constant).
        new: shapes and dtypes of the new residuals.
        consts: values of residuals that are trace-time constants (literals): they
            are not buffers, so ``rec`` does not return them.
    """

    treedef: Any
    sources: tuple[tuple[str, int], ...]
    new: tuple[jax.ShapeDtypeStruct, ...]
    consts: tuple = ()

    @property
    def new_bytes(self) -> int:
        """Bytes of the new residuals (the part of ``abar`` beyond the output)."""
        return sum(spec_bytes(s) for s in self.new)


@dataclass(frozen=True)
class NodeFunctions:
    """The traceable (not yet compiled) functions of one node for given input shapes.

    Attributes:
        fwd, rec, res, bwd: see the module docstring; ``jax.jit`` wrapped, so that
            they trace alike wherever they are called (eagerly, under jit, in autodiff).
        recipe: how ``bwd`` rebuilds the vjp closure from what ``rec`` returns.
        out: shape and dtype of the node output.
    """

    fwd: Callable[..., Any]
    rec: Callable[..., Any]
    res: Callable[..., Any]
    bwd: Callable[..., Any]
    recipe: Recipe
    out: jax.ShapeDtypeStruct

    @property
    def saved_bytes(self) -> int:
        """Bytes of ``abar``: the output plus the new residuals."""
        return spec_bytes(self.out) + self.recipe.new_bytes


@dataclass(frozen=True)
class NodeKernels:
    """The compiled kernels of one node for given input shapes (those its caller asked
    for; the others are None).

    Attributes:
        fwd, rec, res, bwd: compiled ``functions.fwd`` etc. (``bwd`` for a fixed number
            of cotangents).
        functions: what they were compiled from.
    """

    fwd: Kernel | None
    rec: Kernel | None
    res: Kernel | None
    bwd: Kernel | None
    functions: NodeFunctions

    @property
    def recipe(self) -> Recipe:
        return self.functions.recipe

    @property
    def saved_bytes(self) -> int:
        """Bytes of ``abar``: the output plus the new residuals."""
        return self.functions.saved_bytes


def _tree_key(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves))


_FUNCTIONS: dict[tuple, NodeFunctions] = {}
_KERNELS: dict[tuple, NodeKernels] = {}
_LOSS_CACHE: dict[tuple, Kernel] = {}

CHAIN_KERNELS = ("fwd", "rec", "bwd")  # what a chain stage's ops launch
GRAPH_KERNELS = ("fwd", "res", "bwd")  # what a graph node's Computes launch


def _node_key(node: Any, in_specs: tuple) -> tuple:
    return (node.key, _tree_key(node.params), _tree_key(node.rest), _tree_key(in_specs))


def node_functions(node: Any, in_specs: tuple) -> NodeFunctions:
    """The traceable functions of ``node`` for inputs ``in_specs`` (cached; traces once)."""
    key = _node_key(node, in_specs)
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = _build(node, in_specs)
    return _FUNCTIONS[key]


def node_kernels(
    node: Any,
    in_specs: tuple,
    cots: int = 1,
    kinds: tuple[str, ...] = CHAIN_KERNELS,
    cache: dict | None = None,
) -> NodeKernels:
    """Compile (or fetch from ``cache``, default this module's) the kernels ``kinds`` of
    ``node`` for inputs ``in_specs``; ``bwd`` sums ``cots`` cotangents."""
    cache = _KERNELS if cache is None else cache
    in_specs = tuple(_input_spec(node, s) for s in in_specs)
    key = (*_node_key(node, in_specs), cots, kinds)
    if key not in cache:
        fns = node_functions(node, in_specs)
        args = (node.params, node.rest, in_specs)
        bwd_args = (*args, fns.out, fns.recipe.new, (fns.out,) * cots)
        compiled = {
            kind: compile_kernel(getattr(fns, kind), *(bwd_args if kind == "bwd" else args))
            if kind in kinds
            else None
            for kind in ("fwd", "rec", "res", "bwd")
        }
        cache[key] = NodeKernels(**compiled, functions=fns)
    return cache[key]


def stage_functions(stage: Stage, a: jax.ShapeDtypeStruct) -> NodeFunctions:
    """The traceable kernels of a chain stage (a 1-input node) for input ``a``."""
    return node_functions(stage, (a,))


def chain_kernels(
    stages: list[Stage], x: Any
) -> tuple[list[NodeKernels], list[jax.ShapeDtypeStruct]]:
    """Kernels of every stage and the shapes of a_0 .. a_L (cached after the first call)."""
    spec = as_spec("the input x", x)
    specs, kernels = [spec], []
    for stage in stages:
        kernels.append(node_kernels(stage, (spec,)))
        spec = kernels[-1].functions.out
        specs.append(spec)
    return kernels, specs


def split_residuals(leaves: list, known: dict[str, list], consts: dict[int, Any]):
    """Where each leaf of a vjp closure comes from: ``(kind, index)`` pairs and the new arrays.

    ``known`` maps a kind ("param", "rest", "in", "out") to arrays the closure may hold;
    any other leaf is a new residual, counted once. Leaves recorded in ``consts`` (index
    among the new ones -> value) are constants: kept in the recipe, not in abar.
    """
    sources: list[tuple[str, int]] = []
    new: list[Any] = []
    for leaf in leaves:
        for kind, items in known.items():
            if (j := _index_of(leaf, items)) is not None:
                sources.append((kind, j))
                break
        else:
            if (m := _index_of(leaf, new)) is None:
                new.append(leaf)
                m = len(new) - 1
            sources.append(("new", m))
    keep = [m for m in range(len(new)) if m not in consts]
    renumber = {m: i for i, m in enumerate(keep)}
    const_ids = {m: i for i, m in enumerate(sorted(consts))}
    sources = [
        (("new", renumber[m]) if m in renumber else ("const", const_ids[m]))
        if kind == "new"
        else (kind, m)
        for kind, m in sources
    ]
    return tuple(sources), tuple(new[m] for m in keep)


def find_constants(closed: Any, consts: dict[int, Any]) -> None:
    """Record in ``consts`` the new residuals of a traced recording that are constants."""
    const_vals = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    for m, var in enumerate(closed.jaxpr.outvars[1:]):
        if isinstance(var, Literal):
            consts[m] = var.val
        elif var in const_vals:
            consts[m] = const_vals[var]


def _input_spec(node: Any, value: Any) -> Any:
    """An input's shapes: one array, or a tuple of them for a traced program's stage."""
    if isinstance(node, Stage) and node.kind == "program":
        return tree_spec(f"input of {node.name}", value)
    return as_spec(f"input of {node.name}", value)


def _build(node: Any, in_specs: tuple) -> NodeFunctions:
    # One floating-point array (a traced program's stage: a tuple of them), or a clear
    # error (a stage: a stateful layer is refused).
    out = jax.eval_shape(node.apply, node.params, node.rest, *in_specs)
    if isinstance(node, Stage) and node.kind == "program" and isinstance(out, tuple):
        for leaf in out:
            output_spec(node, leaf)
    elif isinstance(node, Stage):
        output_spec(node, out)
    else:
        as_spec(f"node {node.name}'s output", out)
    found: dict[str, Any] = {}
    consts: dict[int, Any] = {}  # index among the new leaves -> constant value

    def known(params: Any, rest: Any, ins: tuple, out: jax.Array) -> dict[str, list]:
        return {
            "param": jax.tree_util.tree_leaves(params),
            "rest": jax.tree_util.tree_leaves(rest),
            "in": jax.tree_util.tree_leaves(ins),
            "out": jax.tree_util.tree_leaves(out),
        }

    def rec(params: Any, rest: Any, ins: tuple) -> tuple[jax.Array, tuple]:
        out, vjp_fn = jax.vjp(lambda p, *xs: node.apply(p, rest, *xs), params, *ins)
        leaves, treedef = jax.tree_util.tree_flatten(vjp_fn)
        sources, new = split_residuals(leaves, known(params, rest, ins, out), consts)
        if "recipe" in found and sources != found["recipe"]:
            # the backward rebuilds the closure from the recipe: other pieces would be
            # taken from the wrong arrays
            raise RuntimeError(
                f"{node.name}: its vjp closure is made of other pieces than when it was "
                f"traced for its recipe: call with the traced shapes and dtypes"
            )
        found["treedef"], found["sources"] = treedef, sources
        return out, new

    # Trace through fresh wrappers: a cached trace would not rerun ``rec``'s Python.
    closed = jax.make_jaxpr(lambda *args: rec(*args))(node.params, node.rest, in_specs)
    find_constants(closed, consts)
    out_spec, new_specs = jax.eval_shape(lambda *args: rec(*args), node.params, node.rest, in_specs)
    const_values = tuple(consts[m] for m in sorted(consts))
    recipe = Recipe(found["treedef"], found["sources"], tuple(new_specs), const_values)
    found["recipe"] = recipe.sources

    def fwd(params: Any, rest: Any, ins: tuple) -> jax.Array:
        return node.apply(params, rest, *ins)

    def res(params: Any, rest: Any, ins: tuple) -> tuple:
        return rec(params, rest, ins)[1]

    def bwd(params: Any, rest: Any, ins: tuple, out: jax.Array, new: tuple, cots: tuple):
        d_out = cots[0]
        for c in cots[1:]:
            d_out = jax.tree_util.tree_map(jax.numpy.add, d_out, c)
        pick = known(params, rest, ins, out)
        pick["new"] = list(new)
        pick["const"] = [jax.numpy.asarray(c) for c in recipe.consts]
        leaves = [pick[kind][i] for kind, i in recipe.sources]
        vjp_fn = jax.tree_util.tree_unflatten(recipe.treedef, leaves)
        d_params, *d_ins = vjp_fn(d_out)
        return d_params, tuple(d_ins)

    # Fresh jit wrappers (their trace caches start after the analysis above): every use
    # traces ``rec`` with jit tracers, as the analysis did, so the recipe always fits.
    return NodeFunctions(jax.jit(fwd), jax.jit(rec), jax.jit(res), jax.jit(bwd), recipe, out_spec)


def _index_of(leaf: Any, items: list) -> int | None:
    for i, item in enumerate(items):
        if item is leaf:
            return i
    return None


def loss_kernel(loss_fn: Callable, out: jax.ShapeDtypeStruct, y: Any) -> Kernel:
    """Compile ``(a_L, y) -> (loss, d_L)`` (cached by the loss function and shapes)."""
    key = (loss_fn, out.shape, str(out.dtype), _tree_key(y))
    if key not in _LOSS_CACHE:
        check_loss(loss_fn, out, y)

        def loss_and_grad(a: jax.Array, target: Any) -> tuple[jax.Array, jax.Array]:
            return jax.value_and_grad(loss_fn)(a, target)

        _LOSS_CACHE[key] = compile_kernel(loss_and_grad, out, y)
    return _LOSS_CACHE[key]
