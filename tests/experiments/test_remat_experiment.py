"""The remat trade-off experiment runs in quick mode and writes a sane CSV and a figure
that passes tests/figure_checks.py."""

from __future__ import annotations

import csv
import math

from figure_checks import check_saved, load_script, recorded


def test_remat_tradeoff_quick(tmp_path, monkeypatch):
    figures = recorded(monkeypatch)
    load_script("paper_experiments/remat_tradeoff.py").main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "remat_tradeoff.png")
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
