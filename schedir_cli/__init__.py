"""The ``schedir`` command line (docs/cli.md): the application on top of the three
library packages (``schedir``, ``solvers``, ``jax_exec``; the last two imported inside
the commands that need them). No library package imports it."""

from schedir_cli.app import main

__all__ = ["main"]
