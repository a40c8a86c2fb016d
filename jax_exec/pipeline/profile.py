"""Profile a sequence of Flax layers and a loss into a ``schedir.Chain`` (docs/jax_exec.md).

Sizes are exact bytes of the arrays the op-by-op runtime keeps (``jax_exec.run``):

- ``in_size[k]``: bytes of a_k (k = L: the model output a_L);
- ``saved_size[k]``: bytes of a_{k+1} plus the residuals of stage k's ``jax.vjp`` that are
  new (not the stage input, not a parameter, each buffer once);
- ``fwd_tmp[k]``: the larger temporary size of the compiled plain and recording forward;
- ``bwd_tmp[k]``: the temporary size of the compiled backward (k = L: of the compiled
  loss-and-gradient).

Times in seconds: ``timing="measure"`` takes the median wall time of repeated runs of
each compiled kernel after warm-up; ``timing="flops"`` divides the kernel's
``cost_analysis()`` FLOPs by ``flops_per_second`` (deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.kernels import chain_kernels, loss_kernel
from jax_exec.profile import check_timing, flops_seconds
from jax_exec.program.compiled import median_time
from jax_exec.stages.split import spec_bytes, split_layers
from schedir import Chain


def profile(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    x: jax.Array,
    y: Any,
    *,
    timing: str = "measure",
    flops_per_second: float = 1e10,
    repeats: int = 7,
) -> Chain:
    """Profile ``layers`` (NNX modules or Linen ``(module, variables)`` pairs) into a Chain.

    Args:
        layers: the stages in order; each maps one array to one array.
        loss_fn: ``loss_fn(out, y)`` -> scalar.
        x, y: a batch (its shapes fix the sizes).
        timing: ``"measure"`` (median wall time, seconds) or ``"flops"``.
        flops_per_second: the rate used by ``timing="flops"``.
        repeats: timed runs per kernel for ``timing="measure"``.

    Raises:
        TypeError: a layer output or the loss is not an array / scalar.
        ValueError: unknown ``timing``, ``repeats`` < 1, ``flops_per_second`` <= 0.
    """
    check_timing(timing, flops_per_second, repeats)
    stages = split_layers(layers).stages
    kernels, specs = chain_kernels(stages, x)
    loss_k = loss_kernel(loss_fn, specs[-1], y)

    fwd_time, bwd_time = [], []
    if timing == "flops":
        for k in kernels:
            fwd_time.append(flops_seconds(k.fwd, flops_per_second))
            bwd_time.append(flops_seconds(k.bwd, flops_per_second))
        bwd_time.append(flops_seconds(loss_k, flops_per_second))
    else:
        a = jnp.asarray(x)
        for stage, k in zip(stages, kernels, strict=True):
            args = (stage.params, stage.rest, (a,))
            fwd_time.append(median_time(k.fwd.call, *args, repeats=repeats))
            out, new = k.rec.call(*args)
            args = (*args, out, new, (jnp.ones_like(out),))
            bwd_time.append(median_time(k.bwd.call, *args, repeats=repeats))
            a = out
        bwd_time.append(median_time(loss_k.call, a, y, repeats=repeats))
    fwd_time.append(0.0)

    return Chain(
        fwd_time=tuple(fwd_time),
        bwd_time=tuple(bwd_time),
        in_size=tuple(spec_bytes(s) for s in specs),
        saved_size=tuple(k.saved_bytes for k in kernels) + (0,),
        fwd_tmp=tuple(max(k.fwd.temp_bytes, k.rec.temp_bytes) for k in kernels) + (0,),
        bwd_tmp=tuple(k.bwd.temp_bytes for k in kernels) + (loss_k.temp_bytes,),
        names=tuple(s.name for s in stages) + ("loss",),
    )
