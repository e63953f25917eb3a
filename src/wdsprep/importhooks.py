"""Run a registration right after a module is first imported: `when_imported(fullname, callback)`.

What lets `import wdsprep` register itself with webdataset (its URL schemes, its `.zst` decoder)
without importing webdataset, which imports torch (seconds), nor the parts of wdsprep that do the
registering (numpy, the storage schemes): the callback imports those when webdataset comes. Nothing
here imports anything of wdsprep, so the package root stays light, and the `wdsprep` command
(`__main__.py`) takes over Ctrl-C before any heavy import.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def when_imported(fullname: str, callback) -> None:
    """Call `callback()` right after the module `fullname` is first imported (once per pair), or now
    when it already is."""
    if fullname in sys.modules:
        callback()
        return
    if not any(isinstance(f, _RegisterOnImport) and (f.fullname, f.callback) == (fullname, callback)
               for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport(fullname, callback))


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Runs a registration (`callback`) right after the module `fullname` is first imported."""

    def __init__(self, fullname: str, callback):
        self.fullname, self.callback = fullname, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)  # find the real module with the other finders
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            self.callback()

        loader.exec_module = exec_module
        return spec
