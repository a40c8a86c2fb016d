"""paper_experiments/auto_remat.py in --quick mode (two models): its CSV has the declared
columns, every method's rows, the summary answers the 50% comparison, and the figure
passes tests/figure_checks.py."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from figure_checks import check_saved, load_script, recorded


@pytest.mark.slow
def test_quick_mode(tmp_path: Path, monkeypatch) -> None:
    figures = recorded(monkeypatch)
    script = load_script("paper_experiments/auto_remat.py")
    assert script.main(["--quick", "--out", str(tmp_path), "--models", "gpt"]) == 0
    check_saved(figures, "auto_remat.png")
    with open(tmp_path / "auto_remat.csv") as f:
        rows = list(csv.DictReader(f))
    methods = {r["method"] for r in rows}
    assert {"auto", "checkpoint_dots", "nothing_saveable", "everything_saveable"} <= methods
    assert "dtr (block graph)" in methods
    milp = [r for r in rows if r["method"].startswith("checkmate_milp")]
    assert milp and all(r["status"] in ("optimal", "time_limit") for r in milp)
    for r in rows:
        assert float(r["peak"]) > 0 and float(r["overhead"]) >= -1e-9
        if r["method"] == "auto":  # the simulator's peak fits the budget asked
            assert int(r["peak"]) <= int(r["budget"])
    text = (tmp_path / "auto_remat.md").read_text()
    assert "| gpt |" in text and "Rockmate" in text and "optimal" in text
    assert (tmp_path / "auto_remat.png").exists()
