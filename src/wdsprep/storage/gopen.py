"""Routes webdataset's `gopen` through our schemes, so plain `wds.WebDataset("s3://...")` works.

`register_webdataset_schemes()` (run for `import wdsprep` once webdataset is imported) puts every scheme of
`wdsprep.storage.SCHEMES` marked `webdataset` into webdataset's own scheme table: `s3://` and
`hf://` (which webdataset lacks), `gs://` (instead of a `gsutil` pipe), `az://` and `http(s)://` (a
resuming stream instead of a `curl` pipe). Reading (`rb`) goes
through `Scheme.open`; writing (`wb`) through `Scheme.open_write` (for `s3://` a multipart upload
streamed from memory, no local file), or webdataset's previous handler where the scheme has no
writer. webdataset imports torch, which takes seconds: when it is not imported yet, the
registration waits for its import. Idempotent; schemes registered later are added by calling it again.
"""
from __future__ import annotations

import sys

from ..importhooks import when_imported
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
