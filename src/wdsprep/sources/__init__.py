"""One package per source (`<id>/`, same file names in each, see README "Adding a source");
`base.py` is the contract, `registry.py` the list of built-in ids."""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `name` from the submodule `names[name]` of `package` on
    first use, so importing a source's converter never loads its readers (and torch)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name], package), name)
        sys.modules[package].__dict__[name] = value
        return value

    return __getattr__
