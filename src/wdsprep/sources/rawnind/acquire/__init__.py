"""RawNIND acquisition: fetch a Dataverse dataset into the native layout, and serve one for tests.

    fetch.py    the trio + httpx pipeline ingest -> scan -> download -> verify -> index -> metadata
                (or -> conversion into shards, with `--convert`); `fetch(FetchOptions) -> report`
    server.py   a Dataverse-compatible file server for a local directory, with fault injection
    cli.py      `wdsprep fetch rawnind` and `wdsprep serve dataverse` (argparse)

Invariants: this subpackage is the only code under `sources/` that imports httpx or trio, and
nothing outside it imports it at module level: the rawnind package, its converter (every
conversion worker) and `wdsprep --help` load neither (tests/core/test_import_graph.py checks it
in a fresh interpreter). It reads the native layout through `..index` and hands complete scenes
to `..metadata` or `..streamconvert`; conversion never imports it back. Names below load on
first use.
"""
from __future__ import annotations

from ... import lazy_exports

__all__ = ["fetch", "FetchOptions", "Fetcher", "DataverseServer", "Faults",
           "add_fetch_arguments", "fetch_main", "add_serve_arguments", "serve_main"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(["fetch", "FetchOptions", "Fetcher"], ".fetch"),
    **dict.fromkeys(["DataverseServer", "Faults"], ".server"),
    **dict.fromkeys(["add_fetch_arguments", "fetch_main", "add_serve_arguments", "serve_main"], ".cli"),
})
