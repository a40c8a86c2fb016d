"""The compiled path with activation offload (DESIGN 5 and 7).

An :class:`~schedir.OffloadSchedule` of ``rotor_offload`` (or ``offload_greedy`` /
``offload_milp``) is a chain schedule tree (:mod:`jax_exec.tree`) whose moves may offload
the *input buffer* of a sub-chain: ``Offload(in)`` right before the sub-chain's first
forward op (``F_all(i)`` or ``F_ck(i)``), its ``Prefetch`` before the sub-chain's last
backward. The lowering is that of :mod:`jax_exec.lowering` (``jax.checkpoint`` per
``F_ck .. F_n`` segment, a ``custom_vjp`` per ``F_all``/``B`` record), plus:

- a segment whose input is offloaded names that input with
  ``jax.ad_checkpoint.checkpoint_name`` inside its region and runs under
  ``jax.checkpoint(policy=save_and_offload_only_these_names(names_which_can_be_saved=[],
  names_which_can_be_offloaded=[name], offload_src="device", offload_dst="pinned_host"))``:
  like a plain segment it saves nothing else, and its input lives in host memory until
  the backward recomputes the segment;
- a record whose input is offloaded (``a[i]``), or whose output ``abar[i+1]`` is the
  offloaded input of the next node, puts those residuals in host memory inside its
  forward rule (``jax.device_put`` to ``jax.memory.Space.Host``) and back in its backward
  rule: a ``custom_vjp``'s residuals are outside the reach of a checkpoint policy (tried:
  a policy around the whole step also re-saves the records' internals).

Checked (tests/test_offload_lowering.py): gradients equal the plain lowering's; at the
top level, :func:`offload_residuals` (JAX's ``saved_residuals``, whose abstract values
say ``float32<host>[...]`` on CPU too) finds the offloaded buffers in host memory and
the device keeps the plain lowering's residuals minus those. XLA schedules the copies
(not the schedule's ``Prefetch`` points). Offloads inside a segment's recomputation
are lowered the same way (nested regions) but only the top level is inspected. When the
offloaded ``abar[i+1]`` feeds a segment, a_{i+1} is held twice on the host (record
residual and segment input); device residuals are unaffected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

from jax_exec.kernels import stage_functions
from jax_exec.lowering import Lowered, Residual
from jax_exec.stages import Stage, as_stages, spec_bytes
from jax_exec.tree import Empty, LossNode, Record, Segment, parse_tree
from schedir import Offload, OffloadSchedule, Prefetch, Wait
from schedir.offload import is_compute

Params = Sequence[Any]


def split_schedule(schedule: OffloadSchedule | Sequence) -> tuple[tuple, set[int]]:
    """(chain ops, positions in them of the compute ops right after an ``Offload``)."""
    ops = schedule.ops if isinstance(schedule, OffloadSchedule) else tuple(schedule)
    chain_ops, offloaded, pending = [], set(), False
    for op in ops:
        if isinstance(op, Offload):
            pending = True
        elif is_compute(op):
            if pending:
                offloaded.add(len(chain_ops))
            chain_ops.append(op)
            pending = False
        elif not isinstance(op, Prefetch | Wait):
            raise TypeError(f"{op!r}: the compiled path lowers activation offload only")
    return tuple(chain_ops), offloaded


@dataclass
class _Names:
    ids: itertools.count
    offloaded_ops: set[int]
    offloaded: set[str]
    saved: set[str]


def _sizes(node) -> int:
    """Number of chain ops of a subtree (to find where each node starts)."""
    if isinstance(node, Empty):
        return 0
    if isinstance(node, LossNode):
        return 1
    if isinstance(node, Record):
        return 2 + _sizes(node.rest)
    return (node.stop - node.start) + _sizes(node.after) + _sizes(node.inside)


def _name_node(names: _Names, node, pos: int) -> str:
    """A fresh name for the input of ``node`` (which starts at chain op ``pos``)."""
    name = f"n{next(names.ids)}"
    if pos in names.offloaded_ops and isinstance(node, Record | Segment):
        names.offloaded.add(name)
    else:
        names.saved.add(name)
    return name


def _to(space, tree):
    return jax.tree_util.tree_map(lambda v: jax.device_put(v, space), tree)


def _recorded(stage: Stage, offload_in: bool, offload_out: bool):
    """``F_all``: :func:`jax_exec.lowering._recorded_stage` whose residual input
    (``offload_in``) or residual output and new residuals (``offload_out``: they are the
    next node's input ``abar``) are put in host memory, and back for the backward."""
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


def _lower(stages, node, loss_fn, offloaded: set[int], pos: int, names: list):
    """``(params, a, y) -> ...`` for ``node``, which starts at chain op ``pos``."""
    if isinstance(node, Empty):
        return lambda params, a, y: a
    if isinstance(node, LossNode):
        checkpointed_loss = jax.checkpoint(loss_fn, prevent_cse=True)
        return lambda params, a, y: checkpointed_loss(a, y)
    if isinstance(node, Record):
        rest_off = pos + 1 in offloaded and isinstance(node.rest, Record | Segment)
        recorded = _recorded(stages[node.index], pos in offloaded, rest_off)
        rest = _lower(stages, node.rest, loss_fn, offloaded, pos + 1, names)

        def record(params: Params, a: jax.Array, y: Any) -> Any:
            return rest(params, recorded(params[node.index], a), y)

        return record
    if isinstance(node, Segment):
        start, stop = node.start, node.stop
        after_pos = pos + (stop - start)
        after = _lower(stages, node.after, loss_fn, offloaded, after_pos, names)
        inside_pos = after_pos + _sizes(node.after)
        inside = _lower(stages, node.inside, loss_fn, offloaded, inside_pos, names)

        if pos in offloaded:  # the input is saved in pinned_host memory, nothing else
            name = f"schedir_in{pos}"
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
class OffloadLowered(Lowered):
    """A lowered offload schedule.

    ``offloaded``: positions (in the chain ops) of the nodes whose input is offloaded;
    ``names``: the ``checkpoint_name`` of each offloaded segment input."""

    offloaded: frozenset = frozenset()
    names: frozenset = frozenset()


def lower_offload(
    layers: Sequence[Any], loss_fn: Callable, schedule: OffloadSchedule | Sequence
) -> OffloadLowered:
    """Lower an activation-offload schedule onto ``layers`` (module doc).

    Raises :class:`schedir.InvalidSchedule` when the chain part is not tree-shaped and
    ``TypeError`` for weight copies (``Evict``, ``w[k]``/``g[k]`` buffers).
    """
    if any(getattr(op, "buffer", "a")[0] in "wg" for op in getattr(schedule, "ops", schedule)):
        raise TypeError("weight copies (w[k], g[k]) are not lowered; use jax_exec.run")
    stages = tuple(as_stages(layers))
    chain_ops, offloaded = split_schedule(schedule)
    tree = parse_tree(chain_ops, len(stages))
    names: list = []
    body = _lower(stages, tree, loss_fn, offloaded, 0, names)

    def loss(params: Params, x: jax.Array, y: Any) -> jax.Array:
        if len(params) != len(stages):
            raise ValueError(f"params has {len(params)} entries, the model {len(stages)} layers")
        return body(list(params), x, y)

    return OffloadLowered(loss, tree, stages, frozenset(offloaded), frozenset(names))


def offload_value_and_grad(
    layers: Sequence[Any], loss_fn: Callable, schedule: OffloadSchedule | Sequence
) -> Callable[[jax.Array, Any], tuple[jax.Array, list]]:
    """A jit-able ``f(x, y) -> (loss, grads)`` following an activation-offload schedule."""
    lowered = lower_offload(layers, loss_fn, schedule)
    step = jax.jit(lowered.value_and_grad)

    def f(x: jax.Array, y: Any) -> tuple[jax.Array, list]:
        return step([s.params for s in as_stages(layers)], x, y)

    return f


def offload_residuals(lowered: Lowered, x: jax.Array, y: Any) -> tuple[list, list]:
    """(device, host) residuals saved at the top level of ``lowered.loss``.

    Parameters and y are left out (as in :func:`jax_exec.saved_activations`); a residual
    is on the host when its abstract value says so (``float32<host>[...]``, i.e.
    ``aval.memory_space`` is ``Host``), which JAX reports on CPU too.
    """

    def step(params: Params, x: jax.Array, y: Any) -> jax.Array:
        return lowered.loss(params, x, y)

    device, host = [], []
    for aval, source in saved_residuals(step, lowered.params(), x, y):
        if source == "from a literal" or source.startswith(
            ("from the argument params", "from the argument y")
        ):
            continue
        shape = tuple(int(d) for d in aval.shape)
        spec = jax.ShapeDtypeStruct(shape, aval.dtype)
        residual = Residual(shape, str(aval.dtype), spec_bytes(spec), source)
        on_host = "host" in str(getattr(aval, "memory_space", "")).lower()
        (host if on_host else device).append(residual)
    return device, host
