"""Deprecated module path: the fetcher lives in `acquire/fetch.py`; this re-exports its names.

The rawnind package exports the *function* `fetch` under this module's name, and Python rebinds a
package attribute to a submodule the first time that submodule is imported. So once this module is
imported, it is what `wdsprep.rawnind.fetch` names, and it stays callable: calling it runs the
fetch. Nothing in wdsprep imports this module.
"""
from __future__ import annotations

import sys
import types

from .acquire.fetch import Fetcher, FetchError, FetchOptions, fetch, sha1_file

__all__ = ["fetch", "Fetcher", "FetchOptions", "FetchError", "sha1_file"]


class _CallableModule(types.ModuleType):
    def __call__(self, options: FetchOptions) -> dict:
        return fetch(options)


sys.modules[__name__].__class__ = _CallableModule
