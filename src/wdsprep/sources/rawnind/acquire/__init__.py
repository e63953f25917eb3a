"""RawNIND acquisition: fetch a Dataverse dataset into the native layout.

    fetch.py    the trio + httpx pipeline ingest -> scan -> download -> verify -> index -> metadata
                (or -> conversion into shards, with `--convert`); `fetch(FetchOptions) -> report`
    cli.py      `wdsprep fetch rawnind` (the `Command` rawnind mounts)

A local Dataverse to fetch from, with fault injection, is a test service: `wdsprep.testing.dataverse`
(`wdsprep serve dataverse DIR` runs one).

Invariants: this subpackage is the only code under `sources/` that imports httpx or trio, and
nothing outside it imports it at module level: the rawnind package, its converter (every
conversion worker) and `wdsprep --help` load neither (tests/core/test_import_graph.py checks it
in a fresh interpreter). It reads the native layout through `..index` and hands complete scenes
to `..metadata` or `..streamconvert` (with the conversion driver it is handed); conversion never
imports it back. Names below load on first use.
"""
from __future__ import annotations

from ... import lazy_exports

__all__ = ["fetch", "FetchOptions", "Fetcher"]

__getattr__ = lazy_exports(__name__, dict.fromkeys(["fetch", "FetchOptions", "Fetcher"], ".fetch"))
