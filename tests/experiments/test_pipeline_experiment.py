"""paper_experiments/steady_state.py in quick mode (its figure passes
tests/figure_checks.py)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from figure_checks import check_saved, recorded

ROOT = Path(__file__).resolve().parents[2]


def test_steady_state_quick(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "steady_state", ROOT / "paper_experiments" / "steady_state.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    figures = recorded(monkeypatch)
    rows = mod.main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "steady_state.png")
    assert (tmp_path / "steady_state.png").stat().st_size > 0
    with open(tmp_path / "steady_state.csv") as f:
        saved = list(csv.DictReader(f))
    assert len(saved) == len(rows) > 0
    methods = {r["method"] for r in saved}
    assert methods >= {"pipeline_dp", "pipeline_milp", "pipeline_greedy", "eager", "dmda", "heft"}
    for r in saved:
        if r["kind"] == "static" and float(r["noise"]) == 0 and r["method"] != "pipeline_greedy":
            assert float(r["relative"]) == 1.0  # both exact solvers reach the best mapping
