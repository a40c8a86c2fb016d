"""A block's recording without the rounding JAX adds for excess precision where no
excess precision exists (float32 and float64 values).

``jax.vjp`` of a ``jax.checkpoint``-ed function rounds each residual it saves to its own
dtype (``reduce_precision`` with the dtype's exponent and mantissa bits; JAX pull request
22244): XLA may compute a bfloat16 or float16 fusion in float32 (excess precision), and
the rounding keeps the saved value equal to the one a recomputation gives. For float32
and float64 values it changes no value, but XLA keeps the operation, and a rounded value
read by several fusions has its producers (e.g. the polynomial of ``erf``) duplicated into
each of them: the compiled step grows (docs/auto.md, "Compiled path"). A recording
(``BlockFunctions.record``) is evaluated here from its jaxpr without those operations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

EXACT = (np.dtype(np.float32), np.dtype(np.float64))  # no excess precision on XLA's backends


def _is_noop_rounding(eqn: Any) -> bool:
    if eqn.primitive.name != "reduce_precision":
        return False
    dtype = np.dtype(eqn.invars[0].aval.dtype)
    if dtype not in EXACT:
        return False
    info = np.finfo(dtype)
    return (eqn.params["exponent_bits"], eqn.params["mantissa_bits"]) == (info.nexp, info.nmant)


def without_noop_rounding(closed: Any) -> Any:
    """``closed`` (a ClosedJaxpr) without its top-level no-op roundings (module
    docstring): their readers read the rounded value's input."""
    if not any(_is_noop_rounding(e) for e in closed.jaxpr.eqns):
        return closed
    alias: dict = {}

    def read(v: Any) -> Any:
        return alias.get(v, v) if isinstance(v, jex_core.Var) else v

    eqns = []
    for eqn in closed.jaxpr.eqns:
        if _is_noop_rounding(eqn):
            alias[eqn.outvars[0]] = read(eqn.invars[0])
            continue
        eqns.append(eqn.replace(invars=[read(v) for v in eqn.invars]))
    jaxpr = closed.jaxpr.replace(eqns=eqns, outvars=[read(v) for v in closed.jaxpr.outvars])
    return closed.replace(jaxpr=jaxpr)


def unrounded(fn: Callable) -> Callable:
    """``fn`` (of arrays, returning arrays) evaluated from its jaxpr, traced at each
    call (it may close over the caller's tracers), without no-op roundings."""

    def wrapped(*args: Any) -> Any:
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = jex_core.jaxpr_as_fun(without_noop_rounding(closed))(
            *jax.tree_util.tree_leaves(args)
        )
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)

    return wrapped
