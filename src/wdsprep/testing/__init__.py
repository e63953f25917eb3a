"""Test services and fixtures: servers the tests (and `wdsprep serve`, `make shards`) start on
127.0.0.1 with free ports, and edits of native inputs. Nothing here imports the rest of wdsprep,
so any layer above may use it (docs/layout.md).

- `S3Server`: moto's S3 in a thread, wrapped to log requests, count completed uploads per key,
  hold uploads at a gate (to kill an uploader "halfway" deterministically) and drop a GET body
  mid-stream (to exercise Range resume).
- `RangeHTTPServer`: a plain HTTP file server with `Range` support and the same fault injection.
- `GCSServer`, `AzuriteServer` (`emulators.py`): the clouds' own emulators (fake-gcs-server,
  Azurite) as child processes; `HubServer` (`hubserver.py`): a Hugging Face Hub endpoint of a
  local directory of repos (revisions, commits, `resolve` with Range and redirects, private repos).
- `DataverseServer` (`dataverse.py`): a Dataverse-compatible server of a local directory, with the
  faults of a fault file (`Faults`), for rawnind's fetch.

The file servers answer `Range` with one parser (`_ranges.byte_range`) and plan their faults with
one `FaultPlan` (`_faults.py`). Every server is a context manager; `S3Server.environment()` sets the
standard AWS variables so boto3 (and `wdsprep.stream` in subprocesses that inherit `os.environ`)
talk to it.

Also here, imported on their own: `wdsprep.testing.edits`, in-place edits of native inputs and
zip members. The suites that drive the command line (the source conformance suite, its measured
child) are `wdsprep.conformance`, above the commands.
"""
from __future__ import annotations

from .dataverse import DataverseServer, Faults
from .emulators import AzuriteServer, GCSServer
from .httpserver import RangeHTTPServer
from .hubserver import HubServer
from .s3server import S3Server

__all__ = ["S3Server", "RangeHTTPServer", "DataverseServer", "Faults", "GCSServer", "AzuriteServer", "HubServer"]
