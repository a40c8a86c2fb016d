"""benchmarks/lowbit_activations.py in --quick mode on one example model (slow): every
storage saves residual bytes and reports a measured gradient error; tolerance 0 never
stores low bit (the script asserts it)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_lowbit_benchmark_quick(tmp_path):
    script = ROOT / "benchmarks" / "lowbit_activations.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--models", "unet", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=1200,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(tmp_path / "lowbit.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["storage"] for r in rows] == ["bfloat16", "float8_e4m3fn", "int8"]
    for r in rows:
        assert 0 < int(r["residual_bytes"]) < int(r["full_bytes"])
        assert float(r["gradient_error"]) > 0
    assert "The planner at 110%" in (tmp_path / "lowbit.md").read_text()
    env = {"PYTHONPATH": str(ROOT)}
    bad = subprocess.run([sys.executable, str(script), "--models", "vgg"], cwd=ROOT, text=True,
                         capture_output=True, timeout=300, env=env)  # fmt: skip
    assert bad.returncode == 2 and "'vgg' unknown" in bad.stderr
