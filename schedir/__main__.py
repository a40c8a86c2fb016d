"""``python -m schedir`` and the ``schedir`` entry point: see :mod:`schedir.cli`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit status."""
    from schedir.cli.app import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
