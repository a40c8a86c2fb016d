"""Traceable functions and compiled kernels of one block (docs/auto.md, "Kernels").

A block is run by an interpreter over its equations. Its arguments, in order: ``p``
(the parameters it reads, differentiated), ``g`` (the other globals it reads: model
state, call arguments, constants) and ``x`` (the cut values it reads). It returns
``outs`` (values later blocks read) and ``results`` (program outputs it makes: the
model state after the call, ``aux``). Inside, every materialized value and every
output gets a ``checkpoint_name`` (``schedir:<equation>:<output>``, local to the
block, so identical blocks share names), so that a save option is a JAX policy:

- ``names``: ``jax.checkpoint(block, policy=save_only_these_names(S + outputs))``;
  JAX saves the named values of S its backward needs and recomputes the rest from
  them and the block inputs;
- ``everything``: no checkpoint, plain autodiff (``everything_saveable``);
- ``dots``: ``checkpoint_dots`` (and the outputs).

For a block and an option the functions are (as :mod:`jax_exec.kernels` does for
stages, with the same :class:`~jax_exec.kernels.Recipe` idea):

- ``forward(p, g, x) -> (outs, results)``;
- ``record(p, g, x) -> (outs, results, new)``: runs ``jax.vjp`` of the policy's
  function and returns the leaves of the vjp closure that are *new* (not a parameter,
  global, block input, output or result; each buffer once; constants kept aside);
- ``backward(p, g, x, outs, results, new, d_outs, d_through) -> (d_p, d_x)``:
  rebuilds the vjp closure from those pieces and applies it (recomputing what the
  option did not save); ``d_through`` are the cotangents of inputs that later blocks
  read too, added to the block's own.

The loss stage's kernel is ``loss_step(p, g, x) -> (loss, results, d_p, d_x)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jax_exec.program.analysis import Analysis
from jax_exec.program.blocks import Block
from jax_exec.program.flat import Lit, Program, aval_bytes, strongly_typed
from jax_exec.program.primitives import ELEMENTWISE, EXPENSIVE, LAYOUT
from jax_exec.program.ties import SELECTORS, tied_values

OPTION_KINDS = ("names", "everything", "dots", "fused")
FUSED = (ELEMENTWISE - EXPENSIVE) | LAYOUT
_UNSAVED = FUSED | SELECTORS  # what xla_fused's policy does not save by primitive
# A save option's host-memory variants (SaveOption.host) -> the suffix of their label
HOST_VARIANTS = {"late": "+late", "all": "+host"}


@dataclass(frozen=True)
class SaveOption:
    """A save option of a block.

    Attributes:
        kind: ``"names"``, ``"everything"`` or ``"dots"`` (module docstring).
        names: for ``"names"``: the local keys ``(equation offset, output index)`` of
            the materialized values saved.
        label: display name (``"save all"``, ``"checkpoint_dots"``, ``"save 3/7"``...).
        host: a host-memory variant (offered with a host link only; "": none): the
            same recording and backward, some saved residuals kept in host memory from
            the recording until the backward brings them back (``HOST_VARIANTS``):
            ``"late"`` those its backward's first phase does not read, each back before
            the first phase that reads it
            (:meth:`jax_exec.program.phases.PhasedBackward.late_residuals`); ``"all"``
            every one, those phase 0 reads back at the backward's start.
    """

    kind: str
    names: frozenset = frozenset()
    label: str = ""
    host: str = field(default="", kw_only=True)  # subclasses' fields stay positional

    def __post_init__(self) -> None:
        if self.kind not in OPTION_KINDS:
            raise ValueError(f"SaveOption.kind = {self.kind!r}: expected one of {OPTION_KINDS}")
        if self.host not in ("", *HOST_VARIANTS):
            raise ValueError(f"SaveOption.host = {self.host!r}: expected '' or one of "
                             f"{tuple(HOST_VARIANTS)}")  # fmt: skip

    def on_device(self) -> SaveOption:
        """The option whose functions and recording this one runs: itself, or the
        variant's option with every saved residual on the device."""
        return replace(self, host="") if self.host else self


@dataclass(frozen=True)
class Layout:
    """How a block's arguments map to program values (positional, so identical blocks
    map alike).

    Attributes:
        params, others: global value ids of its ``p`` and ``g`` arguments.
        ins: cut values of its ``x`` argument; ``act_in`` marks those differentiated.
        outs: values it exports; ``act_out`` marks those with cotangents.
        results: program outputs it makes.
        local: value id -> local key ``(equation offset, output index)``.
        named: local keys that get a checkpoint name (materialized values and outputs,
            but no tied value: no policy can save those).
        tied: the block's values no option saves apart from their operand
            (:mod:`jax_exec.program.ties`).
    """

    params: tuple[int, ...]
    others: tuple[int, ...]
    ins: tuple[int, ...]
    act_in: tuple[bool, ...]
    outs: tuple[int, ...]
    act_out: tuple[bool, ...]
    results: tuple[int, ...]
    local: dict
    named: frozenset
    tied: frozenset


def layout(program: Program, analysis: Analysis, block: Block, is_loss: bool = False) -> Layout:
    """The :class:`Layout` of ``block``; the loss stage's only output is the loss (its
    results are the other program outputs it makes)."""
    params = program.param_like
    local = {}
    for i in range(block.start, block.stop):
        for j, vid in enumerate(program.eqns[i].outs):
            local[vid] = (i - block.start, j)
    outs, results = block.outs, block.results
    if is_loss:
        outs, results = (program.loss,), tuple(v for v in results if v != program.loss)
    named = {local[v] for v in local if v in analysis.materialized}
    named |= {local[v] for v in outs if v in local}
    tied = tied_values(program, analysis, set(local))
    named -= {local[v] for v in tied}
    return Layout(
        params=tuple(g for g in block.globals_ if g in params),
        others=tuple(g for g in block.globals_ if g not in params),
        ins=block.ins,
        act_in=tuple(v in analysis.active for v in block.ins),
        outs=outs,
        act_out=tuple(v in analysis.active for v in outs),
        results=results,
        local=local,
        named=frozenset(named),
        tied=tied,
    )


def _fused_policy(prim, *_, **__) -> bool:
    """Save what XLA stores itself: every result except those of cheap elementwise and
    layout operations, which XLA's fusion recomputes inside their consumers (it
    duplicates cheap producers, not expensive ones: transcendentals, matmuls,
    reductions). A :data:`SELECTORS` result is saved only by its name (the values that
    are not tied, :mod:`jax_exec.program.ties`; inside a loop or a call, none)."""
    name = prim.name
    return name == "name" or name not in _UNSAVED


def _name(key: tuple[int, int]) -> str:
    return f"schedir:{key[0]}:{key[1]}"


# JAX rounds every residual a checkpoint policy saves to its dtype (``reduce_precision``,
# jax/_src/ad_checkpoint.py ``_insert_reduce_precision``, JAX pull request 22244), and
# ``reduce_precision`` refuses complex dtypes (jax 0.10): a policy that saves a complex
# value fails to trace. So complex values are saved as their real and imaginary parts
# (the same bytes; splitting and joining them is exact, and so are their transposes),
# and the policies that save by primitive never save a complex result (it is recomputed
# from what they do save).


def named(val: Any, name: str) -> Any:
    """``checkpoint_name(val, name)``; a complex value through its two real parts."""
    if not jnp.iscomplexobj(val):
        return checkpoint_name(val, name)
    return jax.lax.complex(checkpoint_name(val.real, name), checkpoint_name(val.imag, name))


def _real_results(policy: Callable) -> Callable:
    """``policy`` (a checkpoint policy by primitive) saving no complex result."""

    def saveable(prim, *avals, **params) -> bool:
        if not policy(prim, *avals, **params):
            return False
        try:
            outs = prim.abstract_eval(*avals, **params)[0]
        except Exception:  # pragma: no cover - a primitive without a plain abstract rule
            outs = avals  # judged by its inputs: complex in, complex out
        dtypes = [a.dtype for a in jax.tree.leaves(outs) if hasattr(a, "dtype")]
        return not any(jnp.issubdtype(d, jnp.complexfloating) for d in dtypes)

    return saveable


_FUSED_REAL = _real_results(_fused_policy)  # one policy object, as JAX's caches see it


def block_function(program: Program, block: Block, lay: Layout, naming: bool) -> Callable:
    """``fn(p, g, x) -> (outs, results)`` interpreting the block's equations; with
    ``naming``, materialized values and outputs pass through ``checkpoint_name``."""
    eqns = program.eqns[block.start : block.stop]

    def fn(p: tuple, g: tuple, x: tuple) -> tuple[tuple, tuple]:
        env = dict(zip(lay.params, p, strict=True))
        env.update(zip(lay.others, g, strict=True))
        env.update(zip(lay.ins, x, strict=True))
        for eqn in eqns:
            args = [r.value if isinstance(r, Lit) else env[r] for r in eqn.ins]
            for vid, val in zip(eqn.outs, eqn.bind(*args), strict=True):
                key = lay.local[vid]
                if naming and key in lay.named:
                    val = named(val, _name(key))
                env[vid] = val
        return tuple(env[v] for v in lay.outs), tuple(env[v] for v in lay.results)

    return fn


def _policy(option: SaveOption, lay: Layout):
    cp = jax.checkpoint_policies
    outs = [_name(lay.local[v]) for v in lay.outs if v in lay.local]
    if option.kind == "everything":
        return None
    if option.kind == "dots":
        return cp.save_from_both_policies(_real_results(cp.checkpoint_dots),
                                          cp.save_only_these_names(*outs))  # fmt: skip
    if option.kind == "fused":
        return _FUSED_REAL
    missing = set(option.names) - lay.named
    if missing:
        raise ValueError(f"save option names values that are not materialized: {sorted(missing)}")
    return cp.save_only_these_names(*outs, *(_name(k) for k in sorted(option.names)))


@dataclass(frozen=True)
class Recipe:
    """Where each leaf of a block's vjp closure comes from.

    ``sources[i]`` is ``(kind, j)`` with kind ``"param"``, ``"other"``, ``"in"``,
    ``"out"``, ``"result"``, ``"new"`` (j-th array ``record`` returns) or ``"const"``
    (j-th entry of ``consts``). ``new`` holds the shapes of the new residuals.
    """

    treedef: Any
    sources: tuple[tuple[str, int], ...]
    new: tuple[jax.ShapeDtypeStruct, ...]
    consts: tuple

    @property
    def new_bytes(self) -> int:
        return sum(aval_bytes(s) for s in self.new)


@dataclass(frozen=True)
class BlockFunctions:
    """Traceable functions of one block and save option (module docstring).
    ``recomputes``: the option is a policy (``jax.checkpoint``), whose backward
    recomputes from the pieces it is given what the option did not save: the compiled
    path puts those pieces behind an optimization barrier
    (:func:`jax_exec.execute.barriers.behind_barrier`)."""

    forward: Callable
    record: Callable
    backward: Callable
    recipe: Recipe
    layout: Layout
    recomputes: bool


def as_planned(x: tuple) -> tuple:
    """A block's inputs ``x`` as its functions were traced: strongly typed
    (:func:`~jax_exec.program.flat.strongly_typed`; a weakly typed scalar that crosses a
    cut would otherwise trace the block otherwise than planned)."""
    return tuple(map(strongly_typed, x))


def _split(values: tuple, mask: tuple[bool, ...]) -> tuple:
    return tuple(v for v, m in zip(values, mask, strict=True) if m)


def _classify(leaves: list, known: dict[str, tuple]) -> tuple[list, list, list]:
    """Sources of vjp-closure leaves, the new arrays, and the constants."""
    sources, new, consts = [], [], []
    for leaf in leaves:
        if not isinstance(leaf, jax.core.Tracer):
            sources.append(("const", len(consts)))
            consts.append(leaf)
            continue
        for kind, items in known.items():
            j = next((j for j, item in enumerate(items) if item is leaf), None)
            if j is not None:
                sources.append((kind, j))
                break
        else:
            j = next((j for j, item in enumerate(new) if item is leaf), None)
            if j is None:
                new.append(leaf)
                j = len(new) - 1
            sources.append(("new", j))
    return sources, new, consts


def _sources_text(sources: tuple) -> str:
    return ", ".join(f"{kind} {j}" for kind, j in sources)


def checkpointed_body(program: Program, block: Block, lay: Layout) -> Callable:
    """``body(pd, g, xd, rest) -> (active outs, (outs, results))``: the block (its
    values named) with its differentiated inputs ``xd`` apart from the others
    (``rest``), as the options that are a policy wrap it in ``jax.checkpoint``. One
    function for all the options of a block: ``jax.checkpoint`` caches the traced
    block by the function and JAX caches its JVP by that jaxpr, so every option after
    the first traces only its own partial evaluation and transposition (the options
    are all traced to bound the least budget, :meth:`BlockModel.trace_options`)."""
    fn = block_function(program, block, lay, naming=True)

    def body(pd: tuple, g: tuple, xd: tuple, rest: tuple) -> tuple:
        active, other = iter(xd), iter(rest)
        xs = tuple(next(active) if a else next(other) for a in lay.act_in)
        outs, results = fn(pd, g, xs)
        return _split(outs, lay.act_out), (outs, results)

    return body


def block_functions(
    program: Program, block: Block, lay: Layout, option: SaveOption, specs: tuple,
    body: Callable | None = None,
) -> BlockFunctions:  # fmt: skip
    """The functions of ``block`` under ``option`` (``specs``: shapes of p, g, x;
    ``body``: the block's :func:`checkpointed_body`, shared by its options)."""
    fn = block_function(program, block, lay, naming=option.kind != "everything")
    policy = _policy(option, lay)
    found: dict[str, Any] = {}
    if policy is not None:
        body = body or checkpointed_body(program, block, lay)
        # No barrier of JAX's (prevent_cse): the compiled path puts its own over what the
        # backward reads, on every platform but CPU (jax_exec.execute.barriers); the
        # op-by-op backward runs in kernels of its own, the checkpoint inlined (phases).
        checkpointed = jax.checkpoint(body, policy=policy, prevent_cse=False)

    def forward(p: tuple, g: tuple, x: tuple) -> tuple:
        return fn(p, g, as_planned(x))

    def linearize(p: tuple, g: tuple, x: tuple):
        rest = tuple(v for v, a in zip(x, lay.act_in, strict=True) if not a)

        def f(pd: tuple, xd: tuple) -> tuple:
            if policy is not None:  # g and rest are arguments: no tracer in body's closure
                return checkpointed(pd, g, xd, rest)
            it = iter(xd)
            xs = tuple(next(it) if a else v for v, a in zip(x, lay.act_in, strict=True))
            outs, results = fn(pd, g, xs)
            return _split(outs, lay.act_out), (outs, results)

        act, vjp_fn, (outs, results) = jax.vjp(f, p, _split(x, lay.act_in), has_aux=True)
        return outs, results, vjp_fn

    def record(p: tuple, g: tuple, x: tuple) -> tuple:
        if not all(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves((p, x))):
            return traced_record(p, g, x)  # eager: classify the closure's tracers (below)
        x = as_planned(x)
        outs, results, vjp_fn = linearize(p, g, x)
        leaves, treedef = jax.tree_util.tree_flatten(vjp_fn)
        known = {"param": p, "other": g, "in": x, "out": outs, "result": results}
        sources, new, consts = _classify(leaves, known)
        if "recipe" not in found:
            found["recipe"] = (treedef, tuple(sources), tuple(consts))
        elif tuple(sources) != found["recipe"][1]:
            # the backward rebuilds the closure from the first trace's recipe: a closure
            # made of other pieces would be rebuilt from the wrong arrays
            raise RuntimeError(
                f"a block's vjp closure is made of other pieces than when it was planned "
                f"({_sources_text(sources)} vs {_sources_text(found['recipe'][1])}): "
                f"call with the planned shapes and dtypes"
            )
        return outs, results, tuple(new)

    # Concrete arrays (an eager call) are no tracers, so classifying their closure would
    # take every new residual for a constant: an eager call runs record traced.
    traced_record = jax.jit(record)
    closed = jax.make_jaxpr(record)(*specs)
    treedef, sources, consts = found["recipe"]
    new_specs = tuple(
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
        for v in closed.jaxpr.outvars[len(lay.outs) + len(lay.results) :]
    )
    recipe = Recipe(treedef, sources, new_specs, consts)

    def backward(p, g, x, outs, results, new, d_outs, d_through) -> tuple:
        x = as_planned(x)
        pick = {"param": p, "other": g, "in": x, "out": outs, "result": results, "new": new,
                "const": recipe.consts}  # fmt: skip
        leaves = [pick[kind][j] for kind, j in recipe.sources]
        vjp_fn = jax.tree_util.tree_unflatten(recipe.treedef, leaves)
        d_p, d_x = vjp_fn(tuple(d_outs))
        d_x = tuple(d if t is None else d + t for d, t in zip(d_x, d_through, strict=True))
        return d_p, d_x

    return BlockFunctions(forward, record, backward, recipe, lay, policy is not None)


def loss_function(program: Program, block: Block, lay: Layout) -> Callable:
    """``loss_step(p, g, x) -> (loss, results, d_p, d_x)`` of the loss stage (``lay``
    from ``layout(..., is_loss=True)``)."""
    fn = block_function(program, block, lay, naming=False)

    def loss_step(p: tuple, g: tuple, x: tuple) -> tuple:
        x = as_planned(x)

        def f(pd: tuple, xd: tuple):
            it = iter(xd)
            xs = tuple(next(it) if a else v for v, a in zip(x, lay.act_in, strict=True))
            (value,), results = fn(pd, g, xs)
            return value, results

        grad = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)
        (value, results), (d_p, d_x) = grad(p, _split(x, lay.act_in))
        return value, results, d_p, d_x

    return loss_step
