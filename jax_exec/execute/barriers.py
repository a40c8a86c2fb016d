"""Where the compiled path keeps a recomputation apart from the first forward.

A recomputed region (a Segment's blocks in its backward, the values a Record's option
did not save) must not be merged by XLA with the first forward that computed them, or
the values it was to free stay alive: its inputs go behind an optimization barrier, as
``jax.checkpoint(prevent_cse=True)`` puts them. Not on CPU, whose XLA does not schedule
for memory (the planned step's temporaries there are the plain step's, docs/auto.md
"Calibration against XLA"): there the barriers only kept recomputations that save no
memory and slowed XLA's compile (stop 47, the Segments': the decoder LM at its least
budget 1.52 -> 1.35x the plain step's compile, BERT 1.73 -> 1.43x; stop 49, the
Records': 1.32 -> 1.21x and 1.48 -> 1.32x). One rule for both, here.
"""

from __future__ import annotations

from typing import Any

import jax


def _as_is(values: Any) -> Any:
    return values


def _barrier(values: Any) -> Any:
    return jax.lax.optimization_barrier(values)


def behind_barrier(values: Any) -> Any:
    """``values`` (a pytree of the arrays a recomputation reads) behind an optimization
    barrier on every platform but CPU (``jax.lax.platform_dependent``: lowered for one
    platform, only its branch is emitted)."""
    return jax.lax.platform_dependent(values, cpu=_as_is, default=_barrier)
