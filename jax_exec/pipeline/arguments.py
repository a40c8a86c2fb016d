"""Checks of :func:`jax_exec.pipeline.traced.plan_pipeline`'s arguments: each refuses a
bad value with an error naming the field (hand cuts, devices, the batch and its
micro-batches, a model whose state changes, a loss that micro-batching changes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from jax_exec.pipeline.chunks import split_microbatches
from jax_exec.program.flat import Program


def checked_cuts(cuts: Sequence[int], parts: int, L: int) -> tuple[int, ...]:
    """Hand cuts as a tuple, or a ``ValueError`` naming the field."""
    cuts = tuple(cuts)
    ok = (
        all(isinstance(c, int) and not isinstance(c, bool) for c in cuts)
        and len(cuts) == parts + 1
        and cuts[0] == 0
        and cuts[-1] == L
        and all(a < b for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    )
    if not ok:
        raise ValueError(
            f"cuts = {cuts!r}: expected {parts + 1} increasing block indices from 0 to {L} "
            f"({parts} stages of the traced model's {L} blocks)"
        )
    return cuts


def pipeline_devices(devices: int | Sequence) -> list:
    if isinstance(devices, int) and not isinstance(devices, bool):
        have = jax.devices()
        if not 1 <= devices <= len(have):
            raise ValueError(f"devices = {devices}: this job has {len(have)} devices")
        return list(have[:devices])
    devs = list(devices)
    if not devs or not all(isinstance(d, jax.Device) for d in devs):
        raise ValueError(f"devices = {devices!r}: expected a count or a list of JAX devices")
    return devs


def batch_size(args: tuple, m: int) -> int:
    """The common leading size of every argument leaf, divisible by ``m``."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"microbatches = {m!r}: expected an integer >= 1")
    flat = jax.tree_util.tree_flatten_with_path(tuple(args))[0]
    if not flat:
        raise ValueError("args: the batch is empty (no arrays to split into micro-batches)")
    batch = None
    for path, leaf in flat:
        shape = np.shape(leaf)
        where = f"args{jax.tree_util.keystr(path)}"
        if not hasattr(leaf, "dtype"):
            raise ValueError(
                f"{where} is a {type(leaf).__name__}: every argument leaf must be an "
                f"array with the batch on axis 0 (give a value shared by the micro-batches, "
                f"a step counter, in loss_fn's closure: functools.partial(loss_fn, step=...))"
            )
        if batch is None:
            batch = shape[0] if shape else None
        if not shape or shape[0] != batch:
            raise ValueError(
                f"{where} has shape {list(shape)}: every argument leaf is split into "
                f"micro-batches along axis 0, so it needs the batch size "
                f"{batch} there (pass values without the batch axis inside the model or "
                f"loss_fn's closure)"
            )
    if batch % m:
        raise ValueError(f"the batch of {batch} is not divisible into {m} micro-batches")
    return int(batch)


def refuse_state_changes(model: nnx.Module, program: Program) -> None:
    """A TypeError naming the first state variable that the call writes (parameters
    included: ``nnx.WeightNorm`` writes its layer's)."""
    _, params, rest = nnx.split(model, nnx.Param, ...)
    if program.written:
        paths = jax.tree_util.tree_flatten_with_path(params)[0]
        where = jax.tree_util.keystr(paths[program.written[0][0]][0])
        raise TypeError(
            f"loss_fn writes the model's parameter {where} (nnx.WeightNorm and "
            f"nnx.SpectralNorm write their layer's weights): pipelines refuse it; "
            f"jax_exec.value_and_grad and plan take it"
        )
    flat = jax.tree_util.tree_flatten_with_path(rest)[0]
    for (path, _), before, after in zip(flat, program.rest_ids, program.new_rest, strict=True):
        if before != after:
            where = jax.tree_util.keystr(path)
            raise TypeError(
                f"the model changes its state {where} during loss_fn (dropout drawing "
                f"from nnx.Rngs, BatchNorm statistics in training mode...): it differs "
                f"under micro-batching, so pipelines refuse it. Use model.eval() "
                f"(deterministic dropout, running averages) or remove the layer"
            )


def loss_scale(traced: Any, args: tuple, m: int) -> float:
    """1 when the batch's loss is the mean of the micro-batches' losses, ``m`` when it is
    their sum; a ValueError when it is neither (micro-batching would change it)."""
    loss = jax.jit(lambda p, r, a: traced.pure(p, r, a)[0])
    whole = float(loss(traced.params, traced.rest, tuple(args)))
    parts = [float(loss(traced.params, traced.rest, a)) for a in split_microbatches(tuple(args), m)]
    mean, total = sum(parts) / m, sum(parts)
    tol = 1e-4 * max(1.0, abs(whole))
    if abs(whole - mean) <= tol:
        return 1.0
    if abs(whole - total) <= tol:
        return float(m)
    raise ValueError(
        f"the loss of the batch ({whole:.6g}) is neither the mean ({mean:.6g}) nor the sum "
        f"({total:.6g}) of its {m} micro-batches' losses: loss_fn mixes the items of the "
        f"batch (batch statistics, a normalization over the whole batch...), which "
        f"micro-batching changes"
    )
