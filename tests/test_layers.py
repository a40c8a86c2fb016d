"""The layering is a contract (pyproject.toml, [tool.importlinter]): the IR core imports
no solver, executor, JAX or command line; solvers import no executor or JAX; no package
has an import cycle among its modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    proc = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_ir_core_loads_without_jax_or_solvers() -> None:
    """Importing schedir (and loading, simulating) pulls in no JAX, cvxpy or solver."""
    code = (
        "import sys, schedir; c = schedir.load('examples/chain_small.json'); "
        "schedir.simulate(c, [schedir.F_all(k) for k in range(c.length)] + [schedir.Loss()] "
        "+ [schedir.B(k) for k in reversed(range(c.length))]); "
        "bad = [m for m in ('jax', 'flax', 'cvxpy', 'solvers', 'jax_exec', 'schedir.cli') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
