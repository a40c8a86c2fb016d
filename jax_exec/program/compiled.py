"""A compiled function and what it costs: the one kernel type of every executor.

:func:`lowered_kernel` compiles a lowered function with XLA options and reads its
temporary bytes (``memory_analysis()``) and FLOPs (``cost_analysis()``);
:func:`median_time` times a kernel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class Kernel:
    """One compiled function and what it costs.

    Attributes:
        call: the compiled executable.
        temp_bytes: temporary bytes of the executable (``memory_analysis()``).
        flops: floating-point operations (``cost_analysis()``), 0.0 if unknown.
        out_shardings: where its flat outputs live (``output_shardings``, read for a
            sharded model's kernels, :mod:`jax_exec.program.placement`), else ().
    """

    call: Callable[..., Any]
    temp_bytes: int
    flops: float
    out_shardings: tuple = ()


def compile_kernel(fn: Callable, *args: Any) -> Kernel:
    """Compile ``fn`` for ``args`` (arrays or shapes) and read its temporary bytes and
    FLOPs from XLA."""
    return lowered_kernel(jax.jit(fn).lower(*args))


def lowered_kernel(lowered: Any, options: dict | None = None, placed: bool = False) -> Kernel:
    """Compile a lowered function (``jax.jit(fn).lower(...)``) with XLA ``options``
    and read its temporary bytes and FLOPs (``placed``: and its outputs' shardings)."""
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    stats = compiled.memory_analysis()
    temp = int(stats.temp_size_in_bytes) if stats is not None else 0
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    flops = float((cost or {}).get("flops", 0.0))
    placements = tuple(jax.tree.leaves(compiled.output_shardings)) if placed else ()
    return Kernel(compiled, temp, max(flops, 0.0), placements)


def median_time(call: Callable[..., Any], *args: Any, warmup: int = 2, repeats: int = 7) -> float:
    """Median wall time of ``call(*args)`` in seconds, after ``warmup`` runs."""
    for _ in range(warmup):
        jax.block_until_ready(call(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)
