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
        "bad = [m for m in ('jax', 'flax', 'cvxpy', 'solvers', 'jax_exec', 'schedir_cli') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_solver_module_imports_the_solvers_package_itself() -> None:
    """A module of ``solvers`` imports what it uses from its module (solvers.registry,
    solvers.chain.rotor, ...), never the package ``solvers`` (whose __init__ imports
    every module: a cycle through __init__, even inside a function)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "solvers").rglob("*.py")):
        if path == ROOT / "solvers" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if "solvers" in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], offenders
