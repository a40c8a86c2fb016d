"""Importing the library must not start JAX's backend: ``jax.distributed.initialize``
(multi-process runs, ``schedir launch``) has to come before that, and a module-level
array (a PRNG key made at import) once broke every multi-process program."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import jax_exec, jax_exec.auto, schedir, solvers
from jax._src import xla_bridge  # the test's only look inside JAX: which backends exist
assert not xla_bridge._backends, sorted(xla_bridge._backends)
"""


def test_importing_the_library_starts_no_backend():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
