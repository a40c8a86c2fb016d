"""The compiled path (docs/jax_exec.md): a chain schedule as nested ``jax.checkpoint`` regions.

The schedule's tree (:mod:`jax_exec.tree`) becomes one differentiable function of
``(params, x, y)``:

- a :class:`~jax_exec.execute.tree.Segment` (``F_ck(i) F_n(i+1..j-1)``) runs stages i..j-1
  under ``jax.checkpoint`` (only its input is saved; its backward recomputes the
  stages with the inner structure of the subtree);
- a :class:`~jax_exec.execute.tree.Record` (``F_all(i) .. B(i)``) runs stage i as a
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
from jax.ad_checkpoint import checkpoint_name

from jax_exec.execute.residuals import saved_residuals
from jax_exec.execute.tree import (
    Empty,
    LossNode,
    Node,
    Record,
    Segment,
    check_schedule,
    parse_tree,
    unit_chain,
)
from jax_exec.kernels import stage_functions
from jax_exec.stages.split import (
    LayerWatch,
    Stage,
    StageList,
    activation_specs,
    check_loss,
    spec_bytes,
    split_layers,
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
    """Stage ``stage`` as a recording forward ``(params, rest, a) -> out``: keeps exactly ``abar``.

    A ``jax.custom_vjp`` whose residuals are the stage input, its output and the new
    residuals of its ``jax.vjp`` (the profiler's ``abar``); the backward applies the
    vjp closure rebuilt from them, so nothing is recomputed and the gradients are
    those of plain autodiff. ``rest`` (the layer's other state) is an argument, read
    when the step runs, and gets no gradient. With ``offload_in`` the residual input,
    with ``offload_out`` the output and new residuals (the next node's input ``abar``)
    are put in host memory, and back for the backward.
    """
    host, device = jax.memory.Space.Host, jax.memory.Space.Device

    def functions(a: jax.Array):
        return stage_functions(stage, jax.ShapeDtypeStruct(a.shape, a.dtype))

    @jax.custom_vjp
    def recorded(params: Any, rest: Any, a: jax.Array) -> jax.Array:
        return functions(a).fwd(params, rest, (a,))

    def recorded_fwd(params: Any, rest: Any, a: jax.Array):
        out, new = functions(a).rec(params, rest, (a,))
        kept_a = _to(host, a) if offload_in else a
        kept = _to(host, (out, new)) if offload_out else (out, new)
        return out, (params, rest, kept_a, *kept)

    def recorded_bwd(residuals: tuple, d_out: jax.Array):
        params, rest, a, out, new = residuals
        if offload_in:
            a = _to(device, a)
        if offload_out:
            out, new = _to(device, (out, new))
        d_params, (d_a,) = functions(a).bwd(params, rest, (a,), out, new, (d_out,))
        return d_params, None, d_a  # None: the state is constant

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
    """``(params, rests, a_i, y) -> a_{t+1}`` (or the loss) for the subtree ``node``.

    ``params`` and ``rests`` hold every layer's full parameters and its state.
    ``node`` starts at chain op ``pos``; the nodes starting at a position in
    ``offloaded`` have their input offloaded to host memory (the checkpoint names are
    appended to ``names``): see :mod:`jax_exec.offload_lowering`.
    """
    if isinstance(node, Empty):
        return lambda params, rests, a, y: a
    if isinstance(node, LossNode):
        checkpointed_loss = jax.checkpoint(loss_fn, prevent_cse=True)
        return lambda params, rests, a, y: checkpointed_loss(a, y)
    if isinstance(node, Record):
        rest_off = pos + 1 in offloaded and isinstance(node.rest, Record | Segment)
        recorded = _recorded(stages[node.index], pos in offloaded, rest_off)
        after = _lower_node(stages, node.rest, loss_fn, offloaded, pos + 1, names)
        k = node.index

        def record(params: Params, rests: Params, a: jax.Array, y: Any) -> Any:
            return after(params, rests, recorded(params[k], rests[k], a), y)

        return record
    if isinstance(node, Segment):
        start, stop = node.start, node.stop
        after_pos = pos + (stop - start)
        after = _lower_node(stages, node.after, loss_fn, offloaded, after_pos, names)
        inside_pos = after_pos + _sizes(node.after)
        inside = _lower_node(stages, node.inside, loss_fn, offloaded, inside_pos, names)
        name = f"schedir_in{pos}" if pos in offloaded else None
        if name is not None and names is not None:
            names.append(name)

        def region(sub_params: Params, sub_rests: Params, a: jax.Array) -> jax.Array:
            if name is not None:  # the input is saved in pinned_host memory, nothing else
                a = checkpoint_name(a, name)
            pad = [None] * start  # the state is a constant here as in records: no gradient
            return inside(pad + list(sub_params), pad + _constant(list(sub_rests)), a, None)

        policy = None if name is None else _offload_policy(name)
        checkpointed = jax.checkpoint(region, policy=policy, prevent_cse=True)

        def segment(params: Params, rests: Params, a: jax.Array, y: Any) -> Any:
            out = checkpointed(list(params[start:stop]), list(rests[start:stop]), a)
            return after(params, rests, out, y)

        return segment
    raise TypeError(f"not a schedule tree node: {node!r}")  # pragma: no cover


def _constant(tree: Any) -> Any:
    """The state as a constant of the loss: no gradient flows into it."""

    def stop(v: Any) -> Any:
        dtype = getattr(v, "dtype", None)
        inexact = dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)
        return jax.lax.stop_gradient(v) if inexact else v

    return jax.tree_util.tree_map(stop, tree)


@dataclass(frozen=True)
class Lowered:
    """A schedule lowered onto a model.

    Attributes:
        tree: the schedule's tree.
        body: ``(full params, states, x, y) -> loss``, the schedule's structure.
        model: the layers, split once (:class:`jax_exec.stages.StageList`).

    :meth:`loss` is ``loss(params, x, y, state=None)``, pure and differentiable; its
    autodiff follows the schedule. ``params`` is a list with one parameter pytree per
    layer (``nnx.State`` for NNX), as :meth:`params` returns; a parameter several
    layers read (tied weights) is only in the first of them, and its gradient there is
    the sum over its uses. ``state`` is the layers' non-trainable state, as
    :meth:`state` returns; None reads the layers' state when ``loss`` is called
    (under ``jax.jit``: when it is traced, so pass it as an argument to follow
    changes).
    """

    tree: Node
    body: Callable[[Params, Params, jax.Array, Any], jax.Array]
    model: StageList

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The layers in pure form."""
        return self.model.stages

    def loss(self, params: Params, x: jax.Array, y: Any, state: Params | None = None) -> jax.Array:
        """The loss of the model at ``params`` (and ``state``), following the schedule."""
        n = len(self.model.stages)
        if len(params) != n:
            raise ValueError(f"params has {len(params)} entries, the model {n} layers")
        rests = self.model.state() if state is None else list(state)
        if len(rests) != n:
            raise ValueError(f"state has {len(rests)} entries, the model {n} layers")
        return self.body(self.model.expand(list(params)), rests, x, y)

    def params(self) -> list:
        """The parameters now (a copy: one pytree per layer, shared ones once)."""
        return jax.tree_util.tree_map(lambda v: v, self.model.params())

    def state(self) -> list:
        """The layers' non-trainable state now (a copy: one pytree per layer)."""
        return jax.tree_util.tree_map(lambda v: v, self.model.state())

    def value_and_grad(
        self, params: Params, x: jax.Array, y: Any, state: Params | None = None
    ) -> tuple[jax.Array, list]:
        """``(loss, grads)`` of :meth:`loss` at ``params``; jit-able."""
        return jax.value_and_grad(self.loss)(list(params), x, y, state)


def lower_model(
    model: StageList,
    loss_fn: Callable,
    chain_ops: Schedule | Sequence,
    offloaded: frozenset[int] | set[int] = frozenset(),
    names: list | None = None,
) -> tuple[Node, Callable]:
    """(tree, body) of a chain schedule on split layers; see :func:`lower`."""
    tree = parse_tree(chain_ops, len(model.stages))
    return tree, _lower_node(model.stages, tree, loss_fn, offloaded, 0, names)


def lower(layers: Sequence[Any], loss_fn: Callable, schedule: Schedule | Sequence) -> Lowered:
    """Lower ``schedule`` onto ``layers``: the model transformation behind the compiled path.

    Use ``lowered.loss(params, x, y)`` in place of the model's loss in any training
    loop (e.g. with optax: ``jax.value_and_grad(lowered.loss)``). Raises
    :class:`schedir.InvalidSchedule` for a schedule of another chain length, an invalid
    one, or one that is not tree-shaped, and TypeError for layers that are not a chain
    (:mod:`jax_exec.stages`).
    """
    model = split_layers(layers)
    return Lowered(*lower_model(model, loss_fn, schedule), model)


def jitted_step(layers: Sequence[Any], build: Callable[[StageList], Lowered]) -> Callable:
    """``f(x, y) -> (loss, grads)``: ``build(split layers)`` jitted, values read at each call."""
    current: dict[str, Any] = {}

    def split_and_build() -> None:
        model = split_layers(layers)
        current["model"], current["watch"] = model, LayerWatch(layers)
        current["step"] = jax.jit(build(model).value_and_grad)

    split_and_build()  # a bad model or schedule fails here, not at the first call

    def f(x: jax.Array, y: Any) -> tuple[jax.Array, list]:
        if current["watch"].changed():
            split_and_build()
        model = current["model"]
        return current["step"](model.params(), x, y, model.state())

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
    """Residuals saved at the top level of ``lowered.loss``; parameters, state, y left out.

    Reads JAX's report through :func:`jax_exec.execute.residuals.saved_residuals`. The input x
    counts (it is a[0]).
    """
    out = []
    for aval, source in top_residuals(lowered, x, y):
        if is_model_input(source):
            continue
        shape = tuple(int(d) for d in aval.shape)
        spec = jax.ShapeDtypeStruct(shape, aval.dtype)
        out.append(Residual(shape, str(aval.dtype), spec_bytes(spec), source))
    return out


def top_residuals(lowered: Lowered, x: jax.Array, y: Any) -> list:
    """``(aval, source)`` of every residual saved at the top level of ``lowered.loss``."""

    def step(params: Params, state: Params, x: jax.Array, y: Any) -> jax.Array:
        return lowered.loss(params, x, y, state)

    return saved_residuals(step, lowered.params(), lowered.state(), x, y)


def is_model_input(source: str) -> bool:
    """Whether a residual is a literal, a parameter, the state or y (not an activation)."""
    prefixes = ("from the argument params", "from the argument state", "from the argument y")
    return source == "from a literal" or source.startswith(prefixes)


def expected_activations(
    layers: Sequence[Any], loss_fn: Callable, schedule: Schedule | Sequence, x: jax.Array, y: Any
) -> Counter:
    """The arrays a schedule holds right before its ``Loss`` op, as a multiset.

    Keys are ``(shape, dtype)``: ``a[k]`` contributes a_k, ``abar[k]`` contributes a_k
    and the new residuals of stage k-1 (as the profiler counts them). Compare with
    ``Counter((r.shape, r.dtype) for r in saved_activations(...))``.
    """
    stages = split_layers(layers).stages
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
