"""``python -m schedir_cli`` and the ``schedir`` console script: see :mod:`schedir_cli`."""

from __future__ import annotations

import sys

from schedir_cli.app import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
