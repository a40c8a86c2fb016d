"""Every experiment in ``paper_experiments/`` runs in ``--quick`` mode and writes a sane CSV.

Experiments are discovered by globbing (``*.py`` not starting with ``_``). Each must
have its own quick-mode test (e.g. ``tests/experiments/test_remat_experiment.py``); this file checks
that, and checks the generic contract on one of them: the script exits 0, writes at
least one CSV with a header of distinct names, rows of that width, no NaN, and a PNG;
when the script declares a module-level ``FIELDS = [...]`` list, the CSV's header is
exactly those columns.
"""

from __future__ import annotations

import ast
import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "paper_experiments"


def experiments() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.py") if not p.stem.startswith("_"))


def has_own_test(name: str) -> bool:
    """Another test file runs ``name`` with ``--quick``."""
    this = Path(__file__).name
    return any(
        name in text and "--quick" in text
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.name != this
        for text in [path.read_text()]
    )


def declared_fields(script: Path) -> list[str] | None:
    """The module-level ``FIELDS`` list of string literals, if the script has one."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FIELDS" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
                return list(value)
    return None


UNTESTED = [name for name in experiments() if not has_own_test(name)]


def check_csv(path: Path, fields: list[str] | None) -> None:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows, f"{path.name} is empty"
    header, body = rows[0], rows[1:]
    assert header and len(set(header)) == len(header) and all(header), header
    if fields is not None and len(list(path.parent.glob("*.csv"))) == 1:
        assert header == fields, f"{path.name}: columns {header}, the script declares {fields}"
    assert body, f"{path.name} has no rows"
    for i, row in enumerate(body):
        assert len(row) == len(header), f"{path.name} row {i}: {len(row)} cells"
        nan = [h for h, v in zip(header, row, strict=True) if v.strip().lower() == "nan"]
        assert not nan, f"{path.name} row {i}: NaN in {nan}"


def test_discovery() -> None:
    names = experiments()
    assert "remat_tradeoff" in names and "graph_solvers" in names
    assert not has_own_test("no_such_experiment_name")


def test_every_experiment_has_a_quick_mode_test() -> None:
    # Each experiment is run in --quick mode by its own test file (which checks its
    # columns and values more strictly than a generic check could).
    assert not UNTESTED, f"experiments without a quick-mode test: {UNTESTED}"


@pytest.mark.parametrize("name", ["remat_tradeoff"])
def test_quick_mode_writes_csv(name: str, tmp_path: Path) -> None:
    """The generic contract (CSV + PNG, declared FIELDS, no NaN), on one experiment."""
    script = EXPERIMENTS / f"{name}.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tables = sorted(tmp_path.glob("*.csv"))
    assert tables, f"{name} --quick wrote no CSV"
    for table in tables:
        check_csv(table, declared_fields(script))
    assert list(tmp_path.glob("*.png")), f"{name} --quick wrote no PNG"
