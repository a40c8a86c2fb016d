"""The compiled path (docs/jax_exec.md): a chain schedule as nested ``jax.checkpoint`` regions.

The schedule's tree (:mod:`jax_exec.tree`) becomes one differentiable function of
``(params, x, y)``:

- a :class:`~jax_exec.tree.Segment` (``F_ck(i) F_n(i+1..j-1)``) runs stages i..j-1
  under ``jax.checkpoint`` (only its input is saved; its backward recomputes the
  stages with the inner structure of the subtree);
- a :class:`~jax_exec.tree.Record` (``F_all(i) .. B(i)``) runs stage i as a
  ``jax.custom_vjp`` whose residuals are exactly the profiler's ``abar[i+1]``: the
  stage input, its output and the new residuals of its ``jax.vjp``. Plain autodiff
  would sometimes drop the output (when nothing needs it), so the saved set would no
  longer be the chain model's; the backward applies the stage's own vjp closure, so
  gradients are those of plain autodiff;
- the loss runs under ``jax.checkpoint``, so that its own residuals do not show up.

The same lowering takes offload decisions (:mod:`jax_exec.offload_lowering`): a node
whose input is offloaded names it with ``checkpoint_name`` under an offload policy
(segments) or moves its residuals to host memory (records); with none it is the
plain lowering.

Hence the residuals saved at the top level are exactly the buffers the schedule
holds right before its ``Loss`` op. ``prevent_cse`` stays on so that XLA cannot merge
a recomputation with the first forward. On CPU, judge the result by
:func:`saved_activations` and by gradients, not by ``memory_analysis()``: XLA's CPU
backend drops the barriers and its scheduler does not minimize memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

from jax_exec.kernels import stage_functions
from jax_exec.stages import Stage, activation_specs, as_stages, check_loss, spec_bytes
from jax_exec.tree import (
    Empty,
    LossNode,
    Node,
    Record,
    Segment,
    check_schedule,
    parse_tree,
    unit_chain,
)
from schedir import Loss, Schedule, simulate_chain

Params = Sequence[Any]


def _sizes(node) -> int:
    """Number of chain ops of a subtree (to find where each node starts)."""
    if isinstance(node, Empty):
        return 0
    if isinstance(node, LossNode):
        return 1
    if isinstance(node, Record):
        return 2 + _sizes(node.rest)
    return (node.stop - node.start) + _sizes(node.after) + _sizes(node.inside)


def _to(space, tree):
    return jax.tree_util.tree_map(lambda v: jax.device_put(v, space), tree)


def _recorded(stage: Stage, offload_in: bool = False, offload_out: bool = False):
    """Stage ``stage`` as a recording forward: ``F_all`` keeps exactly ``abar``.

    A ``jax.custom_vjp`` whose residuals are the stage input, its output and the new
    residuals of its ``jax.vjp`` (the profiler's ``abar``); the backward applies the
    vjp closure rebuilt from them, so nothing is recomputed and the gradients are
    those of plain autodiff. With ``offload_in`` the residual input, with
    ``offload_out`` the output and new residuals (the next node's input ``abar``) are
    put in host memory, and back for the backward.
    """
    host, device = jax.memory.Space.Host, jax.memory.Space.Device

    def functions(a: jax.Array):
        return stage_functions(stage, jax.ShapeDtypeStruct(a.shape, a.dtype))

    @jax.custom_vjp
    def recorded(params: Any, a: jax.Array) -> jax.Array:
        return functions(a).fwd(params, stage.rest, a)

    def recorded_fwd(params: Any, a: jax.Array):
        out, new = functions(a).rec(params, stage.rest, a)
        kept_a = _to(host, a) if offload_in else a
        kept = _to(host, (out, new)) if offload_out else (out, new)
        return out, (params, kept_a, *kept)

    def recorded_bwd(residuals: tuple, d_out: jax.Array):
        params, a, out, new = residuals
        if offload_in:
            a = _to(device, a)
        if offload_out:
            out, new = _to(device, (out, new))
        return functions(a).bwd(params, stage.rest, a, out, new, d_out)

    recorded.defvjp(recorded_fwd, recorded_bwd)
    return recorded


def _offload_policy(name: str):
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[name],
        offload_src="device",
        offload_dst="pinned_host",
    )


def _lower_node(
    stages: Sequence[Stage],
    node: Node,
    loss_fn: Callable,
    offloaded: frozenset[int] | set[int] = frozenset(),
    pos: int = 0,
    names: list | None = None,
) -> Callable:
    """``(params, a_i, y) -> a_{t+1}`` (or the loss) for the subtree ``node``.

    ``node`` starts at chain op ``pos``; the nodes starting at a position in
    ``offloaded`` have their input offloaded to host memory (the checkpoint names are
    appended to ``names``): see :mod:`jax_exec.offload_lowering`.
    """
    if isinstance(node, Empty):
        return lambda params, a, y: a
    if isinstance(node, LossNode):
        checkpointed_loss = jax.checkpoint(loss_fn, prevent_cse=True)
        return lambda params, a, y: checkpointed_loss(a, y)
    if isinstance(node, Record):
        rest_off = pos + 1 in offloaded and isinstance(node.rest, Record | Segment)
        recorded = _recorded(stages[node.index], pos in offloaded, rest_off)
        rest = _lower_node(stages, node.rest, loss_fn, offloaded, pos + 1, names)

        def record(params: Params, a: jax.Array, y: Any) -> Any:
            return rest(params, recorded(params[node.index], a), y)

        return record
    if isinstance(node, Segment):
        start, stop = node.start, node.stop
        after_pos = pos + (stop - start)
        after = _lower_node(stages, node.after, loss_fn, offloaded, after_pos, names)
        inside_pos = after_pos + _sizes(node.after)
        inside = _lower_node(stages, node.inside, loss_fn, offloaded, inside_pos, names)

        if pos in offloaded:  # the input is saved in pinned_host memory, nothing else
            name = f"schedir_in{pos}"
            if names is not None:
                names.append(name)

            def region(sub_params: Params, a: jax.Array) -> jax.Array:
                a = checkpoint_name(a, name)
                return inside([None] * start + list(sub_params), a, None)

            checkpointed = jax.checkpoint(region, policy=_offload_policy(name), prevent_cse=True)
        else:

            def region(sub_params: Params, a: jax.Array) -> jax.Array:
                return inside([None] * start + list(sub_params), a, None)

            checkpointed = jax.checkpoint(region, prevent_cse=True)

        def segment(params: Params, a: jax.Array, y: Any) -> Any:
            return after(params, checkpointed(list(params[start:stop]), a), y)

        return segment
    raise TypeError(f"not a schedule tree node: {node!r}")  # pragma: no cover


@dataclass(frozen=True)
class Lowered:
    """A schedule lowered onto a model.

    Attributes:
        loss: ``loss(params, x, y) -> scalar``, pure and differentiable; its autodiff
            follows the schedule. ``params`` is a list with one parameter pytree per
            layer (``nnx.State`` for NNX), as :meth:`params` returns.
        tree: the schedule's tree.
        stages: the layers in pure form (parameters as read when lowering).
    """

    loss: Callable[[Params, jax.Array, Any], jax.Array]
    tree: Node
    stages: tuple[Stage, ...]

    def params(self) -> list:
        """The parameters as read when lowering (one pytree per layer)."""
        return [s.params for s in self.stages]

    def value_and_grad(self, params: Params, x: jax.Array, y: Any) -> tuple[jax.Array, list]:
        """``(loss, grads)`` of :attr:`loss` at ``params``; jit-able."""
        return jax.value_and_grad(self.loss)(list(params), x, y)


def lower(layers: Sequence[Any], loss_fn: Callable, schedule: Schedule | Sequence) -> Lowered:
    """Lower ``schedule`` onto ``layers``: the model transformation behind the compiled path.

    Use ``lowered.loss(params, x, y)`` in place of the model's loss in any training
    loop (e.g. with optax: ``jax.value_and_grad(lowered.loss)``). Raises
    :class:`schedir.InvalidSchedule` for a schedule of another chain length, an invalid
    one, or one that is not tree-shaped.
    """
    stages = tuple(as_stages(layers))
    tree = parse_tree(schedule, len(stages))
    body = _lower_node(stages, tree, loss_fn)

    def loss(params: Params, x: jax.Array, y: Any) -> jax.Array:
        if len(params) != len(stages):
            raise ValueError(f"params has {len(params)} entries, the model {len(stages)} layers")
        return body(list(params), x, y)

    return Lowered(loss, tree, stages)


def value_and_grad(
    layers: Sequence[Any], loss_fn: Callable, schedule: Schedule | Sequence
) -> Callable[[jax.Array, Any], tuple[jax.Array, list]]:
    """A jit-able ``f(x, y) -> (loss, grads)`` following ``schedule``.

    ``grads`` holds one parameter pytree per layer (``nnx.State`` of ``nnx.Param`` for
    NNX layers). Parameters are read from ``layers`` at every call, so the step follows
    model updates (``nnx.update``); under an outer ``jax.jit`` they are read once, at
    tracing. Gradients equal those of ``jax.value_and_grad`` of the plain model.
    Schedules with copy ops (``rotor_offload``) are lowered with host offload
    (``jax_exec.offload_lowering``: ``checkpoint_name`` and
    ``save_and_offload_only_these_names``).
    """
    from jax_exec.runtime import has_copies

    if has_copies(schedule.ops if hasattr(schedule, "ops") else schedule):
        from jax_exec.offload_lowering import lower_offload

        return jitted_step(layers, lower_offload(layers, loss_fn, schedule))
    return jitted_step(layers, lower(layers, loss_fn, schedule))


def jitted_step(layers: Sequence[Any], lowered: Lowered) -> Callable:
    """``f(x, y) -> (loss, grads)``: ``lowered`` jitted, parameters read from ``layers``."""
    step = jax.jit(lowered.value_and_grad)

    def f(x: jax.Array, y: Any) -> tuple[jax.Array, list]:
        return step([s.params for s in as_stages(layers)], x, y)

    return f


@dataclass(frozen=True)
class Residual:
    """One array JAX saves for the backward at the top level of a lowered step.

    Attributes:
        shape, dtype: of the array.
        nbytes: its size, bytes.
        source: JAX's description (``print_saved_residuals``).
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    source: str


def saved_activations(lowered: Lowered, x: jax.Array, y: Any) -> list[Residual]:
    """Residuals saved at the top level of ``lowered.loss``, parameters and y left out.

    Uses ``jax._src.ad_checkpoint.saved_residuals``, the function behind
    ``jax.ad_checkpoint.print_saved_residuals``. The input x counts (it is a[0]).
    """

    def step(params: Params, x: jax.Array, y: Any) -> jax.Array:
        return lowered.loss(params, x, y)

    out = []
    for aval, source in saved_residuals(step, lowered.params(), x, y):
        if source == "from a literal" or source.startswith(
            ("from the argument params", "from the argument y")
        ):
            continue
        shape = tuple(int(d) for d in aval.shape)
        spec = jax.ShapeDtypeStruct(shape, aval.dtype)
        out.append(Residual(shape, str(aval.dtype), spec_bytes(spec), source))
    return out


def expected_activations(
    layers: Sequence[Any], loss_fn: Callable, schedule: Schedule | Sequence, x: jax.Array, y: Any
) -> Counter:
    """The arrays a schedule holds right before its ``Loss`` op, as a multiset.

    Keys are ``(shape, dtype)``: ``a[k]`` contributes a_k, ``abar[k]`` contributes a_k
    and the new residuals of stage k-1 (as the profiler counts them). Compare with
    ``Counter((r.shape, r.dtype) for r in saved_activations(...))``.
    """
    stages = as_stages(layers)
    specs = activation_specs(stages, x)
    check_loss(loss_fn, specs[-1], y)
    ops = check_schedule(schedule, len(stages))
    # Buffer names only matter here, so a unit chain of the right length is enough.
    trace = simulate_chain(unit_chain(len(stages)), ops, record_buffers=True)
    at = next(i for i, op in enumerate(ops) if isinstance(op, Loss))
    before = trace.buffers[at - 1] if at > 0 else frozenset({"a[0]"})

    def key(spec: jax.ShapeDtypeStruct) -> tuple:
        return (tuple(int(d) for d in spec.shape), str(spec.dtype))

    found: Counter = Counter()
    for name in before:
        kind, k = name.rstrip("]").split("[")
        k = int(k)
        found[key(specs[k])] += 1
        if kind == "abar":
            recipe = stage_functions(stages[k - 1], specs[k - 1]).recipe
            for spec in recipe.new:
                found[key(spec)] += 1
    return found
