"""The compiled path with activation offload (docs/offload.md, docs/jax_exec.md).

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

Checked (tests/jax_exec/test_offload_lowering.py): gradients equal the plain lowering's; at the
top level, :func:`offload_residuals` (JAX's ``saved_residuals``, whose abstract values
say ``float32<host>[...]`` on CPU too) finds the offloaded buffers in host memory and
the device keeps the plain lowering's residuals minus those. XLA schedules the copies
(not the schedule's ``Prefetch`` points). Offloads inside a segment's recomputation
are lowered the same way (nested regions) but only the top level is inspected. When the
offloaded ``abar[i+1]`` feeds a segment, a_{i+1} is held twice on the host (record
residual and segment input); device residuals are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from jax_exec.chain.lowering import (
    Lowered,
    Residual,
    is_model_input,
    jitted_step,
    lower_model,
    top_residuals,
)
from jax_exec.stages.split import StageList, spec_bytes, split_layers
from schedir import Offload, OffloadSchedule, Prefetch, Wait
from schedir.offload.ops import is_compute


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


@dataclass(frozen=True)
class OffloadLowered(Lowered):
    """A lowered offload schedule.

    ``offloaded``: positions (in the chain ops) of the nodes whose input is offloaded;
    ``names``: the ``checkpoint_name`` of each offloaded segment input."""

    offloaded: frozenset = frozenset()
    names: frozenset = frozenset()


def lower_offload(
    layers: Sequence[Any] | StageList, loss_fn: Callable, schedule: OffloadSchedule | Sequence
) -> OffloadLowered:
    """Lower an activation-offload schedule onto ``layers`` (module doc).

    Raises :class:`schedir.InvalidSchedule` when the chain part is not tree-shaped and
    ``TypeError`` for weight copies (``Evict``, ``w[k]``/``g[k]`` buffers).
    """
    if any(getattr(op, "buffer", "a")[0] in "wg" for op in getattr(schedule, "ops", schedule)):
        raise TypeError("weight copies (w[k], g[k]) are not lowered; use jax_exec.run")
    model = layers if isinstance(layers, StageList) else split_layers(layers)
    chain_ops, offloaded = split_schedule(schedule)
    names: list = []
    tree, body = lower_model(model, loss_fn, chain_ops, offloaded, names)
    return OffloadLowered(tree, body, model, frozenset(offloaded), frozenset(names))


def offload_value_and_grad(
    layers: Sequence[Any], loss_fn: Callable, schedule: OffloadSchedule | Sequence
) -> Callable[[jax.Array, Any], tuple[jax.Array, list]]:
    """A jit-able ``f(x, y) -> (loss, grads)`` following an activation-offload schedule."""
    return jitted_step(layers, lambda model: lower_offload(model, loss_fn, schedule))


def offload_residuals(lowered: Lowered, x: jax.Array, y: Any) -> tuple[list, list]:
    """(device, host) residuals saved at the top level of ``lowered.loss``.

    Parameters, state and y are left out (as in :func:`jax_exec.saved_activations`); a
    residual is on the host when its abstract value says so (``float32<host>[...]``,
    i.e. ``aval.memory_space`` is ``Host``), which JAX reports on CPU too.
    """
    device, host = [], []
    for aval, source in top_residuals(lowered, x, y):
        if is_model_input(source):
            continue
        shape = tuple(int(d) for d in aval.shape)
        spec = jax.ShapeDtypeStruct(shape, aval.dtype)
        residual = Residual(shape, str(aval.dtype), spec_bytes(spec), source)
        on_host = "host" in str(getattr(aval, "memory_space", "")).lower()
        (host if on_host else device).append(residual)
    return device, host
