"""Run every experiment (or those named) and write ``results/REPORT.md``.

    python -m paper_experiments [--quick] [--out results] [--timeout S] [NAME ...]

Same as ``schedir experiments``; the runner is :mod:`schedir_cli.report`. Experiments are
found by globbing this folder (``*.py`` not starting with ``_``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schedir_cli.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(directory=Path(__file__).resolve().parent))
