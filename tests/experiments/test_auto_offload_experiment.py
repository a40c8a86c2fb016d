"""paper_experiments/auto_offload.py in --quick mode: every (model, link, budget) row,
joint plans never slower than remat alone or offload alone, the summary names the POFO
anchor, and the figure passes tests/figure_checks.py."""

from __future__ import annotations

import csv
from pathlib import Path

from figure_checks import check_saved, load_script, recorded


def test_quick_mode(tmp_path: Path, monkeypatch) -> None:
    figures = recorded(monkeypatch)
    script = load_script("paper_experiments/auto_offload.py")
    assert script.main(["--quick", "--out", str(tmp_path)]) == 0
    check_saved(figures, "auto_offload.png")
    with open(tmp_path / "auto_offload.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["link"] for r in rows} == {"pcie4", "pcie5", "nvlink-c2c"}
    assert {r["model"] for r in rows} == {"gpt", "resnet"}
    for r in rows:
        assert float(r["joint_overhead"]) <= float(r["remat_overhead"]) + 1e-12
        if r["offload_only_overhead"] != "":  # rotor_offload's model holds these schedules
            assert float(r["joint_overhead"]) <= float(r["offload_only_overhead"]) + 1e-12
    assert "POFO" in (tmp_path / "auto_offload.md").read_text()
