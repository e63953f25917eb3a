"""A shard directory from a stranger is read safely or refused in one line naming what is wrong.

- A manifest row's index fields (`index_offset`, `index_bytes`, `index_digest`) that do not describe
  its shard's last bytes: one `ManifestError` line naming the manifest, the field and the shard, on
  load (locally and over HTTP), before any read; a row handed to a read path directly: a `ShardError`
  naming the field, with no read outside the shard (no request at all for a remote one).
- Member names that are paths (`../x`, `/abs/x`, `dir/x`, a field `a/../../x`) or hidden names:
  refused by every reader, in an index or in the tar itself (a shard without an index), by
  `verify` and by `reindex`, and never written by the writer. Today's readers passed such a key
  through to the user's code (a key is commonly used as a file name).
- A server that sends `Content-Encoding: gzip` whatever it is asked for: the error names the encoding.

The hostile shards are built here as a stranger would: `tarfile` headers, the index's msgpack
written by the format's rules (docs/format.md) with `struct` and `xxhash`, a manifest with `json`.
"""
import gzip
import hashlib
import io
import json
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import numpy as np
import pytest
import xxhash

import wdsprep
from wdsprep.readoptions import ReadOptions
from wdsprep.errors import FormatError, ManifestError, ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.writer import ShardWriter
from wdsprep.stream.access import ShardAccess
from wdsprep.stream.read import checked_samples
from wdsprep.stream.remote import ReadAhead
from wdsprep.testing import RangeHTTPServer
from wdsprep.conformance import read_manifest, run_cli, shard_bytes

from tests.timeouts import SUBPROCESS

CLI = [sys.executable, "-m", "wdsprep"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> pathlib.Path:
    """A small conversion (`wdsprep convert generic`), several indexed shards."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "in" / "train").mkdir(parents=True)
    for i in range(24):
        np.save(root / "in" / "train" / f"s{i:03d}.array.npy", np.arange(i, i + 200, dtype=np.float32))
    status, _, err = run_cli("convert", "generic", root / "in", root / "out", "--shard-bytes", "8KB", "--quiet")
    assert status == 0, err
    assert len(shard_bytes(root / "out")) >= 3
    return root / "out"


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# ------------------------------------------------------------------ index fields outside the shard
def _past_the_end(row):
    return row["bytes"]


BAD_INDEX_FIELDS = {  # (field, the value a hostile row gives it)
    "negative offset": ("index_offset", lambda row: -512),
    "offset at the end": ("index_offset", _past_the_end),
    "offset one block early": ("index_offset", lambda row: row["index_offset"] - 512),
    "offset as a string": ("index_offset", lambda row: str(row["index_offset"])),
    "no index bytes": ("index_bytes", lambda row: 0),
    "index bytes not whole blocks": ("index_bytes", lambda row: row["index_bytes"] + 1),
    "digest not xxh3": ("index_digest", lambda row: "sha1:" + "0" * 40),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEX_FIELDS))
def test_index_fields_outside_the_shard_are_one_line_naming_the_manifest_the_field_and_the_shard(converted, tmp_path, case):
    field, value = BAD_INDEX_FIELDS[case]
    work = tmp_path / "set"
    shutil.copytree(converted, work)
    manifest = read_manifest(work)
    row = manifest["splits"]["train"]["shards"][1]
    row[field] = value(row)
    (work / "manifest.json").write_text(json.dumps(manifest))
    where = f"splits.train.shards[1].{field}: "
    for command in ("verify", "inspect"):
        status, _, err = run_cli(command, work)
        line = one_line(err)
        assert status == 1 and line.startswith(f"wdsprep: error: {work / 'manifest.json'}: {where}"), line
        assert row["name"] in line, line
    with pytest.raises(ManifestError) as local:
        list(wdsprep.dataset(str(work), "train"))
    with RangeHTTPServer(tmp_path) as server:
        with pytest.raises(ManifestError) as remote:
            list(wdsprep.dataset(server.url_of("set/manifest.json"), "train"))
        assert not [request for request in server.requests if request["name"].endswith(".tar")]
    for caught in (local.value, remote.value):
        assert where in str(caught) and row["name"] in str(caught), caught


def test_each_read_path_checks_a_rows_index_fields_before_it_reads(converted, tmp_path):
    """A row handed to a reader without a manifest (the map-style and remote readers take rows):
    the same check, as the shard's `ShardError` naming the field; no byte outside the shard read."""
    row = dict(read_manifest(converted)["splits"]["train"]["shards"][0], index_offset=-512)
    path = str(converted / row["name"])
    with pytest.raises(ShardError, match=r"manifest row: index_offset: expected a non-negative integer \(got -512"):
        ShardAccess([path], [row]).index(0)
    with pytest.raises(ShardError, match="manifest row: index_offset"):
        list(checked_samples(path, row))
    with RangeHTTPServer(converted) as server:
        url = server.url_of(row["name"])
        read_ahead = ReadAhead([(url, row, 0, row["samples"])], options=ReadOptions.from_environment({}), max_connections=2)
        try:
            with pytest.raises(ShardError, match="manifest row: index_offset") as caught:
                read_ahead.open(url, 0, row["samples"])
        finally:
            read_ahead.close()
        assert url in str(caught.value) and server.requests == []


# ------------------------------------------------------------------------ member names that are paths
def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def _npy(i: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.full(3, i, np.float32))
    return buffer.getvalue()


def stranger_shard(directory: pathlib.Path, samples: list[tuple[str, str]], indexed: bool) -> dict:
    """A shard of one member per sample `(key, field)` named `key.field`, written with tarfile; with
    `indexed`, its `__wdsprep_index__` by the format's rules and the row's index fields. Also its
    manifest. Returns the row."""
    body, offsets, layouts, layout, sizes, digests = bytearray(), [], [], [], [], []
    for i, (key, field) in enumerate(samples):
        offsets.append(len(body))
        part = _member(f"{key}.{field}", _npy(i))
        if [field] not in layouts:
            layouts.append([field])
        layout.append(layouts.index([field]))
        sizes.append(len(_npy(i)))
        digests.append(xxhash.xxh3_64_intdigest(part))
        body += part
    row = {"name": "train-00000-00.tar", "samples": len(samples)}
    if indexed:
        index = _member("__wdsprep_index__", msgpack.packb({
            "format": "wdsprep-index/2", "digest": "xxh3_64", "keys": [key for key, _ in samples], "layouts": layouts,
            "layout": struct.pack(f"<{len(layout)}I", *layout), "offsets": struct.pack(f"<{len(offsets)}Q", *offsets),
            "sizes": struct.pack(f"<{len(sizes)}Q", *sizes), "digests": struct.pack(f"<{len(digests)}Q", *digests)}))
        row.update(index_offset=len(body), index_bytes=len(index), index_digest=f"xxh3_64:{xxhash.xxh3_64_intdigest(index):016x}")
        body += index
    data = bytes(body) + bytes(1024)
    row.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    directory.mkdir(parents=True)
    (directory / row["name"]).write_bytes(data)
    manifest = {"format": "wdsprep/2", "manifest_version": 1, "source": "generic", "config": {}, "fingerprint": "x",
                "splits": {"train": {"shards": [row], "samples": row["samples"], "bytes": row["bytes"]}}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return row


HOSTILE = {  # (key, field) of the middle sample
    "parent": ("../evil", "array.npy"),
    "absolute": ("/tmp/evil", "array.npy"),
    "directory": ("dir/evil", "array.npy"),
    "field with a path": ("evil", "array/../../x.npy"),
    "hidden": ("__evil", "array.npy"),
}


def _keys_until_error(samples) -> tuple[list, BaseException | None]:
    keys = []
    try:
        for sample in samples:
            keys.append(sample["__key__"])
            assert all(".." not in name and "/" not in name for name in sample), sample.keys()
    except ShardError as error:
        return keys, error
    return keys, None


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_member_name_that_is_a_path_in_an_index_is_refused_before_any_sample(tmp_path, case):
    key, field = HOSTILE[case]
    row = stranger_shard(tmp_path / "set", [("ok0", "array.npy"), (key, field), ("ok2", "array.npy")], indexed=True)
    name = key if case != "field with a path" else field
    with RangeHTTPServer(tmp_path) as server:
        for manifest in (str(tmp_path / "set" / "manifest.json"), server.url_of("set/manifest.json")):
            keys, error = _keys_until_error(wdsprep.dataset(manifest, "train"))
            assert keys == [] and error is not None, (keys, manifest)
            assert row["name"] in str(error) and repr(name) in str(error) and "not a plain name" in str(error), error
    with pytest.raises(ShardError, match="not a plain name"):
        ShardAccess([str(tmp_path / "set" / row["name"])], [row]).index(0)
    status, _, err = run_cli("verify", tmp_path / "set")
    assert status == 1 and "BAD" in err and repr(name) in err, err


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_member_name_that_is_a_path_in_a_shard_without_index_is_refused_by_readers_verify_and_reindex(tmp_path, case):
    key, field = HOSTILE[case]
    row = stranger_shard(tmp_path / "set", [("ok0", "array.npy"), (key, field), ("ok2", "array.npy")], indexed=False)
    member = f"{key}.{field}"
    keys, error = _keys_until_error(wdsprep.dataset(str(tmp_path / "set" / "manifest.json"), "train"))
    assert keys in ([], ["ok0"]) and error is not None, keys
    assert row["name"] in str(error) and repr(member) in str(error) and "not a plain name" in str(error), error
    with pytest.raises(ShardError, match="not a plain name"):
        ShardAccess([str(tmp_path / "set" / row["name"])], [row]).index(0)
    status, _, err = run_cli("verify", tmp_path / "set")
    assert status == 1 and "BAD" in err and repr(member) in err, err
    before = (tmp_path / "set" / row["name"]).read_bytes(), read_manifest(tmp_path / "set")
    status, _, err = run_cli("reindex", tmp_path / "set", "--quiet")
    line = one_line(err)
    assert status == 1 and repr(member) in line and "left as it is" in line, line
    assert ((tmp_path / "set" / row["name"]).read_bytes(), read_manifest(tmp_path / "set")) == before


@pytest.mark.parametrize("key", ["dir/evil", "../evil", "/abs", "a\\b", "__hidden", "nul\0key"])
def test_the_writer_never_writes_a_key_that_readers_refuse(tmp_path, key):
    writer = ShardWriter(str(tmp_path), "train-00000", shard_bytes=1 << 20, encoder=Encoder())
    with writer:
        writer.write("ok", {"x": 1})
        with pytest.raises(FormatError, match=f"sample key {re.escape(repr(key))} is (empty or contains a dot|not a plain name)"):
            writer.write(key, {"x": 1})
    with tarfile.open(tmp_path / writer.rows[0].name) as archive:
        assert archive.getnames() == ["ok.x.mp", "__wdsprep_index__"]


# ----------------------------------------------------------------- a server that gzips what it sends
class _Gzipping(BaseHTTPRequestHandler):
    """Serves the files of `root` whole (no Range), gzipped, whatever the client asked for."""

    root: pathlib.Path
    suffix: str

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.root / self.path.lstrip("/")
        data = path.read_bytes()
        compressed = path.name.endswith(self.suffix)
        body = gzip.compress(data) if compressed else data
        self.send_response(200)
        if compressed:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("suffix", ["manifest.json", ".tar"])
def test_a_body_sent_with_content_encoding_gzip_is_refused_naming_the_encoding(converted, suffix):
    handler = type("Handler", (_Gzipping,), {"root": converted, "suffix": suffix})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/manifest.json"
        expected = ManifestError if suffix == "manifest.json" else ShardError
        with pytest.raises(expected, match="Content-Encoding: gzip") as caught:
            list(wdsprep.dataset(url, "train"))
        assert "not valid JSON" not in str(caught.value)
        result = subprocess.run(CLI + ["verify", url, "--quiet"], capture_output=True, text=True, timeout=SUBPROCESS)
        assert result.returncode == 1 and "Content-Encoding: gzip" in result.stderr, result.stderr
    finally:
        server.shutdown()
        server.server_close()
