"""Several processes (hosts) in one JAX job: joining it, and moving one array between hosts.

A script that runs under ``schedir launch`` (local CPU processes) or ``srun`` (a cluster,
docs/multihost.md) calls :func:`initialize_from_env` first, before it touches a device.
After it, ``jax.devices()`` lists the devices of every process (process p's after
process p - 1's), a ``Mesh`` of them spans the hosts, and ``shard_map`` collectives
(``ppermute``, ``psum``) cross them: on CPU through gloo.

Each process only dispatches work to its own devices (JAX's multi-controller model).
:func:`transfer` moves one array from a device of one process to a device of another
with a two-device ``ppermute``: both processes call it at the same point of their
programs (the sender with the array, the receiver with its shape), which the MPMD
executor ensures by running the same deterministic dispatch loop in every process.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from schedir.cluster import LOCAL_DEVICES, ClusterEnvError, ProcessGroup

__all__ = ["ClusterEnvError", "ProcessGroup", "initialize_from_env", "is_local", "transfer"]


def initialize_from_env(
    environ: Mapping[str, str] | None = None, *, timeout_s: int = 120
) -> ProcessGroup | None:
    """Join the job described by the ``SCHEDIR_*`` variables (:mod:`schedir.cluster`).

    Returns the :class:`ProcessGroup`, or None when no variable is set (one process:
    nothing to do, the script runs as it would alone). On the CPU platform the
    collectives go through gloo. Raises :class:`ClusterEnvError` for a missing or bad
    variable, and when this process sees another number of devices than
    ``SCHEDIR_LOCAL_DEVICES`` (XLA_FLAGS set too late, after jax was initialized).
    ``timeout_s``: seconds to wait for every process to join.
    """
    group = ProcessGroup.from_env(os.environ if environ is None else environ)
    if group is None:
        return None
    if (os.environ.get("JAX_PLATFORMS") or "cpu").split(",")[0] == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=group.coordinator,
        num_processes=group.num_processes,
        process_id=group.process_id,
        initialization_timeout=timeout_s,
    )
    local = len(jax.local_devices())
    if group.local_devices is not None and local != group.local_devices:
        raise ClusterEnvError(
            f"{LOCAL_DEVICES} = {group.local_devices} but this process has {local} devices "
            "(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count must be set before "
            "jax is imported)"
        )
    return group


def is_local(device: jax.Device) -> bool:
    """Whether this process dispatches to ``device``."""
    return device.process_index == jax.process_index()


# One jitted two-device shift per (sender, receiver) pair; jit's cache separates shapes.
_MOVERS: OrderedDict = OrderedDict()
MOVER_CACHE_SIZE = 256


def _mover(src: jax.Device, dst: jax.Device):
    key = (src, dst)
    if key not in _MOVERS:
        mesh = Mesh(np.array([src, dst]), ("pair",))
        shift = jax.shard_map(
            lambda a: jax.lax.ppermute(a, "pair", [(0, 1)]),
            mesh=mesh,
            in_specs=P("pair"),
            out_specs=P("pair"),
        )
        _MOVERS[key] = (jax.jit(shift), NamedSharding(mesh, P("pair")))
        while len(_MOVERS) > MOVER_CACHE_SIZE:
            _MOVERS.popitem(last=False)
    _MOVERS.move_to_end(key)
    return _MOVERS[key]


def transfer(
    value: jax.Array | None, src: jax.Device, dst: jax.Device, aval: jax.ShapeDtypeStruct
) -> jax.Array | None:
    """Move an array of shape/dtype ``aval`` from ``src`` to ``dst``.

    Both ends must call it (a collective of the two devices' processes): the process
    of ``src`` passes the array (on ``src``), the process of ``dst`` passes None and
    gets the array on ``dst``; the sender gets None. On one process this is
    ``jax.device_put``.
    """
    if is_local(src) and is_local(dst):
        return jax.device_put(value, dst)
    if not (is_local(src) or is_local(dst)):
        raise ValueError(f"transfer {src} -> {dst}: neither device belongs to this process")
    run, sharding = _mover(src, dst)
    mine = src if is_local(src) else dst
    if is_local(src):
        if value is None:
            raise ValueError(f"transfer {src} -> {dst}: the sender must pass the array")
        piece = jax.device_put(value, src)
    else:
        piece = jax.device_put(np.zeros(aval.shape, aval.dtype), dst)
    if piece.ndim == 0:
        raise ValueError(f"transfer {src} -> {dst}: a scalar (expected an array with axis 0)")
    # the two devices' pieces side by side on axis 0: no reshape, nothing to compile
    # but the shift itself
    shape = (2 * aval.shape[0], *aval.shape[1:])
    moved = run(jax.make_array_from_single_device_arrays(shape, sharding, [piece]))
    if is_local(src):
        return None
    (shard,) = [s for s in moved.addressable_shards if s.device == mine]
    return shard.data


def transfer_tree(value: Any, src: jax.Device, dst: jax.Device, aval: Any) -> Any:
    """:func:`transfer` of an array or a tuple of arrays (``aval`` alike: a traced
    model's stages carry tuples); a scalar travels as an array of one element. The
    receiver passes None and gets the tree on ``dst``; the sender gets None."""
    if not isinstance(aval, tuple):
        return transfer(value, src, dst, aval)
    if is_local(src) and is_local(dst):
        return jax.device_put(value, dst)
    parts = value if value is not None else (None,) * len(aval)
    moved = []
    for part, spec in zip(parts, aval, strict=True):
        one = jax.ShapeDtypeStruct((1, *spec.shape), spec.dtype)
        got = transfer(None if part is None else part[None], src, dst, one)
        moved.append(None if got is None else got[0])
    return None if is_local(src) else tuple(moved)
