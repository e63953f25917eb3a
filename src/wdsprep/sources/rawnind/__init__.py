"""RawNIND: acquisition from Dataverse (trio + httpx), alignment metadata, clean/noisy crop pairs."""
from __future__ import annotations

from .cli import add_fetch_arguments, add_serve_arguments, fetch_main, serve_main
from .fetch import FetchError, FetchOptions, fetch
from .server import DataverseServer, Faults

__all__ = [
    "add_fetch_arguments", "fetch_main", "add_serve_arguments", "serve_main",
    "fetch", "FetchOptions", "FetchError", "DataverseServer", "Faults",
]
