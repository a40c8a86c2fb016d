"""Profile a stage list and solve for a memory budget in one call (``jax_exec.plan_stages``;
``jax_exec.plan`` is the automatic planner of any model, :mod:`jax_exec.auto`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

import solvers
from jax_exec.chain.profile import profile
from schedir import Chain, Schedule


def plan_stages(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    x: jax.Array,
    y: Any,
    budget: int,
    method: str = "rotor",
    *,
    timing: str = "measure",
    **options: Any,
) -> tuple[Chain, Schedule]:
    """Profile ``layers`` on the batch ``(x, y)`` and solve for ``budget`` bytes.

    ``budget`` counts activation bytes only (the chain's memory: a_0, kept activations,
    residuals, gradients of activations, temporaries), not parameters or their
    gradients. Raises :class:`solvers.Infeasible` (whose message and ``min_budget``
    give the least feasible budget) when nothing fits.
    """
    chain = profile(layers, loss_fn, x, y, timing=timing)
    return chain, solvers.solve(chain, budget, method=method, **options)
