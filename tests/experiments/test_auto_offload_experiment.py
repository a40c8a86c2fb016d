"""paper_experiments/auto_offload.py in --quick mode: every (model, link, budget) row,
joint plans never slower than remat alone, the summary names the POFO anchor."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_mode(tmp_path: Path) -> None:
    script = ROOT / "paper_experiments" / "auto_offload.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(tmp_path / "auto_offload.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["link"] for r in rows} == {"pcie4", "pcie5", "nvlink-c2c"}
    assert {r["model"] for r in rows} == {"gpt", "resnet"}
    for r in rows:
        assert float(r["joint_overhead"]) <= float(r["remat_overhead"]) + 1e-12
    assert "POFO" in (tmp_path / "auto_offload.md").read_text()
