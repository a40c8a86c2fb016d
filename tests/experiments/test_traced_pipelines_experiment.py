"""paper_experiments/traced_pipelines.py in --quick mode on the U-Net: both plans per
setting, the automatic plan within the hand baseline's memory per device, the figure
passes tests/figure_checks.py."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from figure_checks import check_saved, load_script, recorded


@pytest.mark.slow
def test_quick_mode(tmp_path: Path, monkeypatch) -> None:
    figures = recorded(monkeypatch)
    script = load_script("paper_experiments/traced_pipelines.py")
    assert script.main(["--quick", "--out", str(tmp_path), "--models", "unet"]) == 0
    check_saved(figures, "traced_pipelines.png")
    with open(tmp_path / "traced_pipelines.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["platform"], r["method"]) for r in rows} == {
        (p, m) for p in ("identical", "mixed") for m in ("auto", "hand (even cut)")
    }
    for r in rows:
        assert float(r["throughput"]) > 0 and 0 <= float(r["bubble"]) < 1
        if r["method"] == "auto":  # made within every device's memory
            assert int(r["max_peak"]) <= int(r["memory"])
    assert "hand baseline's throughput" in (tmp_path / "traced_pipelines.md").read_text()
