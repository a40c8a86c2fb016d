"""The remat trade-off experiment runs in quick mode and writes a sane CSV and a PNG."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_remat_tradeoff_quick(tmp_path):
    script = ROOT / "paper_experiments" / "remat_tradeoff.py"
    subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)], check=True)
    with open(tmp_path / "remat_tradeoff.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(rows[0]) == {
        "model", "stages", "method", "budget", "budget_fraction", "makespan", "overhead",
        "peak", "solve_time",
    }  # fmt: skip
    assert len({r["model"] for r in rows}) >= 2
    for r in rows:
        assert all(math.isfinite(float(r[k])) for k in ("makespan", "overhead", "budget"))
        assert int(r["peak"]) <= int(r["budget"])
    by_budget: dict = {}
    for r in rows:
        by_budget.setdefault((r["model"], r["budget"]), {})[r["method"]] = float(r["makespan"])
    for methods in by_budget.values():  # rotor is the best wherever it has a schedule
        if "rotor" in methods:
            assert methods["rotor"] <= min(methods.values()) * (1 + 1e-9)
    assert (tmp_path / "remat_tradeoff.png").stat().st_size > 10_000
