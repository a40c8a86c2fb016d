"""Compiled kernels: the one kernel type of every executor, how a block model's kernels
are compiled, and the process-wide caches that keep them.

:func:`lowered_kernel` compiles a lowered function with XLA options and reads its
temporary bytes (``memory_analysis()``) and FLOPs (``cost_analysis()``);
:func:`median_time` times a kernel. :func:`traced_kernels` (and :func:`kernels_of`)
lower functions in one thread while XLA compiles those already lowered in others, with
:data:`KERNEL_OPTIONS`, each lowered program once per process; :func:`in_background`
runs such a compilation in the one thread that compiles ahead. :func:`clear_caches`
forgets the kernels and the tables every :class:`~jax_exec.program.model.BlockModel`
of the process shares (:data:`BLOCK_TABLES`); :func:`bound_caches` does so where a new
model's planning starts once the process holds half the memory mappings the system
allows (:func:`mapping_count`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import re
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jax_exec.program.flat import sub_jaxprs


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


# The op-by-op runtime's kernels measure memory; they need not be fast. Compiled without
# the backend's (LLVM's) optimizations and with XLA CPU's simpler fusion code generator,
# they compile about 3x faster on CPU. The planner reads their temporary bytes and the
# runtime runs the same executables, so predicted and measured bytes agree by
# construction. (The compiled path, Plan.lowered, is compiled by the user's jax.jit.)
KERNEL_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,  # the planner compiles kernels in parallel
}

# Kernels by their lowered program's text and argument and result trees, for the whole
# process: kernels of different blocks (or plans) that lower alike compile once.
_KERNELS: dict[str, Kernel] = {}


# What every BlockModel of the process shares, by what a block computes
# (BlockModel.identity): its traced functions, compiled kernels (BlockModel.kernel_key),
# phased backwards and options.
BLOCK_TABLES: dict[str, dict] = {"functions": {}, "kernels": {}, "phases": {}, "options": {}}


def clear_caches() -> None:
    """Forget every block's options, functions, phases and compiled kernels (the
    process-wide tables :data:`BLOCK_TABLES`, the kernels by lowered program); later plans
    compile again."""
    for table in BLOCK_TABLES.values():
        table.clear()
    _KERNELS.clear()
    _LOWERINGS.clear()


def mapping_count() -> tuple[int, int] | None:
    """``(held, limit)``: the memory mappings this process holds and the most the system
    allows it (``/proc/self/maps``, ``vm.max_map_count``); None where unknown (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            held = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return held, limit


def bound_caches() -> bool:
    """Clear the caches (:func:`clear_caches`) when the process holds more than half the
    memory mappings the system allows, and say so (a ``jax_exec`` log warning); True if
    they were cleared. Called where a new model's planning starts
    (:func:`~jax_exec.program.build.program_model`), never within one: a plan's model
    reads back what it compiled. Why: each XLA CPU executable holds about 3-10 mappings,
    the caches never evict, and past ``vm.max_map_count`` (65,530 by default) LLVM fails
    to compile ("Cannot allocate memory") and the process then crashes: a process that
    plans a few hundred models reached it."""
    count = mapping_count()
    if count is None or 2 * count[0] <= count[1]:
        return False
    _AHEAD.submit(lambda: None).result()  # an earlier model's kernels compiled ahead end first
    kernels = len(_KERNELS)
    clear_caches()
    logging.getLogger("jax_exec").warning(
        "the process held %d of the %d memory mappings the system allows; "
        "cleared the planner's caches (%d kernels): later plans compile again",
        count[0], count[1], kernels,
    )  # fmt: skip
    return True


def kernels_of(sources: list[tuple], progress: Callable | None = None) -> list[Kernel]:
    """``jax.jit(fn)`` of every ``((fn, *args), out_shardings)`` compiled for ``args``
    with :data:`KERNEL_OPTIONS` (cached by the lowered program), with its temporary
    bytes and FLOPs (:func:`traced_kernels` of them); with ``out_shardings`` (a sharded
    model's kernel: ``args`` carry their shardings), its outputs placed so (None leaves:
    where XLA places them)."""
    named = traced_kernels([lambda: list(enumerate(sources))], progress)
    return [kernel for _, kernel in named]


def traced_kernels(
    batches: list[Callable[[], list[tuple]]], progress: Callable | None = None
) -> list[tuple[Any, Kernel]]:
    """The kernels of every ``(name, ((fn, *args), out_shardings))`` that the
    ``batches`` return, as ``(name, kernel)`` in their order. The batches are called,
    and their functions traced and lowered, one after the other in one worker thread
    (tracing holds the GIL) while XLA compiles those already lowered in others
    (compilation releases it): a batch's tracing (a block's recording, its backward's
    phases) overlaps the compilation of the kernels before it. Worker threads, not the
    caller's: a mesh the caller set (``jax.set_mesh``) is thread-local and must not
    reach the kernels, whose placement their argument shapes (and a sharded model's
    ``out_shardings``) say."""
    futures: dict[str, Future] = {}
    events: queue.SimpleQueue = queue.SimpleQueue()  # lowered kernels, for progress

    def known(key: str) -> bool:  # compiled, or being compiled
        return key in _KERNELS or key in futures

    def lower_all(pool: ThreadPoolExecutor) -> list[tuple[Any, str]]:
        order = []
        try:
            for batch in batches:
                for name, ((fn, *args), placed) in batch():
                    key, low = _lowered(fn, tuple(args), placed, known)
                    order.append((name, key))
                    if low is None:  # known by its traced program: not lowered again
                        events.put(len(order))
                        continue
                    if not known(key):
                        futures[key] = pool.submit(lowered_kernel, low, KERNEL_OPTIONS,
                                                   placed is not None)  # fmt: skip
                    events.put(len(order))
        finally:
            events.put(None)
        return order

    done = _LOWERING.submit(lower_all, _COMPILING)
    while (lowered := events.get()) is not None:
        if progress is not None:
            progress(math.nan, f"lowered {lowered} kernels")
    order = done.result()
    for i, (key, future) in enumerate(futures.items()):
        _KERNELS[key] = future.result()
        if progress is not None:
            progress((i + 1) / len(futures), f"compiled {i + 1}/{len(futures)} kernels")
    return [(name, _KERNELS[key]) for name, key in order]


def _lowered(
    fn: Callable, args: tuple, out_shardings: Any = None, known: Callable = _KERNELS.__contains__
) -> tuple[str, Any]:
    """The cache key of ``jax.jit(fn)`` for ``args`` (with ``out_shardings`` if any) and
    its lowering (``.lower(*args)``), or None for a program lowered before whose kernel
    is ``known`` (compiled, or being compiled). A key is the lowered program's text (its
    module name aside, the shardings in it) and calling convention; the traced
    program's key (:func:`_traced_key`) says which lowering it gave. Lowering (StableHLO
    emission, ~10-40 ms a kernel, holding Python's lock) is the larger part of a
    kernel's cost on the planner's critical path, and different options and blocks
    trace to the same program often (at 65%, 213 of the zoo's 1,119 lowerings)."""
    jitted = jax.jit(fn) if out_shardings is None else jax.jit(fn, out_shardings=out_shardings)
    traced = jitted.trace(*args)
    before = _traced_key(traced, args, out_shardings)
    if before is not None and before in _LOWERINGS and known(_LOWERINGS[before]):
        return _LOWERINGS[before], None
    lowered = traced.lower()
    text = re.sub(r"^module @\S+", "module @kernel", lowered.as_text(), count=1)  # its name
    trees = f"{lowered.in_tree} -> {lowered.out_tree}"  # the executable's calling convention
    key = hashlib.sha256((trees + text).encode()).hexdigest()
    if before is not None:
        _LOWERINGS[before] = key
    return key, lowered


# Lowered programs' keys by their traced program's (_traced_key), for the whole process.
_LOWERINGS: dict[str, str] = {}


def _traced_key(traced: Any, args: tuple, out_shardings: Any) -> str | None:
    """A key of what ``traced.lower()`` gives: the jaxpr's text, the bytes of its
    constants (nested programs' too), the arguments' and results' types with their weak
    types and shardings, the calling convention and ``out_shardings``. None where the
    text may not say all (lowered then): where it names a Python object by address
    (``<... at 0x...>``: a callback, whose lowering embeds it, and an address that a
    later object may reuse) or abridges (``...``: numpy's print of a large array)."""
    closed = traced.jaxpr
    text = str(closed.jaxpr)
    if " at 0x" in text or "..." in text:
        return None
    digest = hashlib.sha256(text.encode())
    for const in _consts(closed):
        if jax.dtypes.issubdtype(getattr(const, "dtype", None), jax.dtypes.extended):
            digest.update(f"|{const.dtype}|".encode())  # a PRNG key: its type and bits
            const = jax.random.key_data(const)
        array = np.asarray(const)
        digest.update(f"|{array.dtype}{array.shape}|".encode())
        digest.update(array.tobytes())
    avals = jax.tree.leaves((traced.in_avals, traced.out_avals))
    types = [(a.shape, str(a.dtype), a.weak_type) for a in avals]
    places = [getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(args)]
    digest.update(
        f"|{types}|{places}|{traced.in_tree} -> {traced.out_tree}|{out_shardings}".encode()
    )
    return digest.hexdigest()


def _consts(closed: Any):
    """The constants of a closed jaxpr and of every closed jaxpr in its equations'
    parameters, nested (a ``custom_jvp_call``'s, a branch's), in order."""
    yield from closed.consts
    yield from _nested_consts(closed.jaxpr)


def _nested_consts(jaxpr: Any):
    for eqn in jaxpr.eqns:
        for sub in sub_jaxprs(eqn.params):
            if isinstance(sub, jax.extend.core.ClosedJaxpr):
                yield from _consts(sub)
            else:  # an open jaxpr (a checkpoint's, a shard_map's)
                yield from _nested_consts(sub)


# XLA's compilations, for the whole process: a thread started while the lowering thread
# holds the GIL waits for it (Python's switch interval, 5 ms), per kernel batch
_COMPILING = ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="jax_exec-xla")

# The lowering threads, for the whole process: a thread started per call waited for the
# GIL to start (up to Python's switch interval); two, for the caller's thread and the one
# that compiles ahead (a batch's tracing never lowers kernels itself: no call nests)
_LOWERING = ThreadPoolExecutor(2, thread_name_prefix="jax_exec-lowering")

# one thread compiles ahead (it starts the lowering and compiling threads of its kernels)
_AHEAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jax_exec-kernels-ahead")


def in_background(build: Callable[..., Any], *args: Any) -> Future:
    """``build(*args)`` in the one thread that compiles ahead, after what was submitted
    to it before."""
    return _AHEAD.submit(build, *args)
