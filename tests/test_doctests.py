"""The examples in the docstrings of schedir and solvers run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import schedir
import solvers


def _modules() -> list[str]:
    names = []
    for package in (schedir, solvers):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str, monkeypatch) -> None:
    monkeypatch.chdir(schedir.__path__[0] + "/..")  # examples read examples/*.json
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
