"""The graph solvers experiment runs in --quick mode and writes its CSV and its figure
(which passes tests/figure_checks.py)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from figure_checks import check_saved, recorded

ROOT = Path(__file__).resolve().parents[2]


def test_graph_solvers_quick(tmp_path: Path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location(
        "graph_solvers", ROOT / "paper_experiments" / "graph_solvers.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    figures = recorded(monkeypatch)
    mod.main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "graph_solvers.png")
    rows = list(csv.DictReader(open(tmp_path / "graph_solvers.csv")))
    assert (tmp_path / "graph_solvers.png").stat().st_size > 0
    assert {r["method"] for r in rows} >= {"checkmate_milp", "dtr", "rotor", "chen_sqrt"}
    for key in {(r["family"], r["size"], r["fraction"]) for r in rows}:
        group = [r for r in rows if (r["family"], r["size"], r["fraction"]) == key]
        ok = {r["method"]: float(r["makespan"]) for r in group if r["status"] == "ok"}
        assert int(max(float(r["peak"]) for r in group if r["status"] == "ok")) <= int(
            group[0]["budget"]
        )
        if "checkmate_milp" in ok:  # the MILP is the best graph method
            graph_methods = [m for m in ok if m != "rotor"]
            assert all(ok["checkmate_milp"] <= ok[m] + 1e-6 for m in graph_methods)
