"""What the chain profiler (:func:`jax_exec.profile`) and the graph profiler
(:func:`jax_exec.profile_graph`) share: the timing options and the FLOP-based costs.

Both read the same compiled kernels (:mod:`jax_exec.kernels`): sizes are the exact bytes
of the arrays a kernel returns, temporaries its ``memory_analysis()`` bytes, and with
``timing="flops"`` a kernel's cost is its ``cost_analysis()`` FLOPs divided by
``flops_per_second`` (deterministic). With ``timing="measure"`` the chain profiler
takes the median wall time of each kernel and the graph profiler that of each
``Compute`` in the op-by-op runtime.
"""

from __future__ import annotations

from jax_exec.program.compiled import Kernel

TIMINGS = ("measure", "flops")


def check_timing(
    timing: str, flops_per_second: float, repeats: int, known: tuple[str, ...] = TIMINGS
) -> None:
    """Raise ``ValueError`` naming the option that is not valid (``known``: the
    profiler's timings)."""
    if timing not in known:
        raise ValueError(f"timing = {timing!r}: expected one of {', '.join(known)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats = {repeats!r}: expected an int >= 1")
    if not flops_per_second > 0:
        raise ValueError(f"flops_per_second = {flops_per_second!r}: expected a positive rate")


def flops_seconds(kernel: Kernel, flops_per_second: float) -> float:
    """Seconds of ``kernel`` under ``timing="flops"``."""
    return kernel.flops / flops_per_second
