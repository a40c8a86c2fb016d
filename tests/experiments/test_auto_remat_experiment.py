"""paper_experiments/auto_remat.py in --quick mode (two models): its CSV has the declared
columns, every method's rows, and the summary answers the 50% comparison."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_mode(tmp_path: Path) -> None:
    script = ROOT / "paper_experiments" / "auto_remat.py"
    argv = [sys.executable, str(script), "--quick", "--out", str(tmp_path), "--models", "gpt"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
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
