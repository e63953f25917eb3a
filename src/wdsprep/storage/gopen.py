"""Routes webdataset's `gopen` through our schemes, so plain `wds.WebDataset("s3://...")` works.

`register_webdataset_schemes()` (called by `import wdsprep`) puts every scheme of
`wdsprep.storage.SCHEMES` marked `webdataset` into webdataset's own scheme table: `s3://` and
`hf://` (which webdataset lacks), `gs://` (instead of a `gsutil` pipe), `az://` and `http(s)://` (a
resuming stream instead of a `curl` pipe). Reading (`rb`) goes
through `Scheme.open`; writing (`wb`) through `Scheme.open_write` (for `s3://` a multipart upload
streamed from memory, no local file), or webdataset's previous handler where the scheme has no
writer. webdataset imports torch, which takes seconds: when it is not imported yet, the
registration waits for its import. Idempotent; schemes registered later are added by calling it again.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from . import SCHEMES

_registered: set[str] = set()


def register_webdataset_schemes() -> None:
    """Make `webdataset.gopen` read (and, where we write them, write) our `webdataset` schemes."""
    wds_gopen = sys.modules.get("webdataset.gopen")  # the module (the package exports a function)
    if wds_gopen is None:
        when_imported("webdataset.gopen", register_webdataset_schemes)
        return
    handlers = wds_gopen.gopen_schemes
    for name, scheme in list(SCHEMES.items()):
        if scheme.webdataset and name not in _registered:
            handlers[name] = _handler(scheme, handlers.get(name))
            _registered.add(name)


def _handler(scheme, previous):
    def gopen(url, mode="rb", bufsize=8192, **kw):
        if mode == "rb":
            return scheme.open(url)
        if mode == "wb":
            writer = scheme.open_write(url)
            if writer is not None:
                return writer
            if previous is not None:
                return previous(url, mode, bufsize, **kw)
        raise ValueError(f"{url}: cannot open with mode {mode!r}")

    return gopen


def when_imported(fullname: str, callback) -> None:
    """Call `callback()` right after the module `fullname` is first imported (once per pair)."""
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
