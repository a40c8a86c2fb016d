"""XLA flags of the test suite (tests/conftest.py) and of the subprocesses tests start.

The suite compiles without LLVM's optimizations (``--xla_backend_optimization_level=0``)
and with XLA CPU's older fusion code generator (``--xla_cpu_use_fusion_emitters=false``),
what the planner itself uses to read kernels' temporary bytes
(``jax_exec.program.compiled.KERNEL_OPTIONS``): compiling is about 2.7x as fast on CPU (the
plain steps of 20 random models: 8.98 s at the default level, 6.37 s without LLVM's
optimizations, 3.32 s with both flags), the code runs slower, and every byte figure
is the same, since XLA's buffer assignment runs before code generation
(tests/jax_exec/test_auto_optimized.py checks that in a process at the default level).
Timing claims live in benchmarks, which run at the default level. Set
``SCHEDIR_TEST_OPTIMIZED=1`` to run the suite at the default level.
"""

from __future__ import annotations

import os

FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1"
)


def suite_flags() -> str:
    """XLA_FLAGS for the test process: the inherited ones plus :data:`FAST_COMPILE`."""
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("SCHEDIR_TEST_OPTIMIZED") or "xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} {FAST_COMPILE}".strip()


def device_flags(devices: int) -> str:
    """XLA_FLAGS for a subprocess with ``devices`` forced host devices (the suite's too)."""
    flags = os.environ.get("XLA_FLAGS", "")
    return f"{flags} --xla_force_host_platform_device_count={devices}".strip()
