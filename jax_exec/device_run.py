"""One executed step of a :class:`jax_exec.device_plan.DevicePlan` (its measured bytes),
and the meshes and batch shares it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jax_exec.zero import AXIS, ZeroStep


@dataclass(frozen=True)
class DeviceRun:
    """One executed step of a :class:`jax_exec.device_plan.DevicePlan`.

    Attributes:
        loss: the step's loss (mean over the devices' shares).
        state: the :class:`jax_exec.zero.ZeroState` after the step.
        grads: the gradients, placed as the strategy keeps them.
        measured: ``"params"``, ``"grads"``, ``"opt_state"`` (device memory) and
            ``"host"`` (the optimizer state in host memory): device id -> bytes, from
            the arrays' addressable shards.
        activation_peak: the op-by-op runtime's measured activation peak on the first
            device's share (every device runs the same program on its share); GSPMD:
            of the global batch on one device (the plan's whole-step figure).
        zero_step: the step that ran (``zero_step.with_grads(state, batch)`` goes on
            training, compiled once).
        plan: the plan that ran (a :class:`jax_exec.device_plan.DevicePlan`, which
            imports this module).
    """

    loss: jax.Array
    state: Any
    grads: Any
    measured: dict
    activation_peak: int
    zero_step: ZeroStep = field(repr=False)
    plan: Any = field(repr=False)

    @property
    def state_bytes(self) -> int:
        """The largest device's measured parameters + gradients + optimizer state."""
        parts = ("params", "grads", "opt_state")
        devices = {d for p in parts for d in self.measured[p]}  # (sgd: no optimizer state)
        return max((sum(self.measured[p].get(d, 0) for p in parts) for d in devices), default=0)

    @property
    def measured_bytes(self) -> int:
        """Measured state bytes + measured activation peak (the reserved communication
        buffers are the model's: XLA places its collectives' buffers itself)."""
        return self.state_bytes + self.activation_peak


def default_mesh(devices: int) -> Mesh:
    """A ``data`` mesh over the first ``devices`` JAX devices."""
    found = jax.devices()
    if len(found) < devices:
        raise ValueError(f"data_parallel = {devices}: only {len(found)} JAX devices here")
    return Mesh(np.array(found[:devices]), (AXIS,))


def per_device(args: tuple, devices: int) -> tuple:
    """The first device's share of ``args``: every array leaf's leading axis (the
    batch) divided by ``devices``; ValueError naming a leaf it does not divide."""
    out = []
    for path, x in jax.tree_util.tree_leaves_with_path(tuple(args)):
        shape = np.shape(x)
        if not shape or shape[0] % devices:
            raise ValueError(
                f"args{jax.tree_util.keystr(path)} shape {shape}: its leading axis (the "
                f"batch) must be a multiple of data_parallel = {devices}"
            )
        out.append(x[: shape[0] // devices])
    return tuple(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tuple(args)), out))
