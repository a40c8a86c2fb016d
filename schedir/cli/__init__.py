"""The ``schedir`` command line (docs/cli.md): an application on top of the IR,
``solvers`` and ``jax_exec`` (imported inside the commands). Nothing in the IR core
imports this package."""

from schedir.cli.app import main

__all__ = ["main"]
