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
- Values nested deeper than the format allows (`codec.MAX_DEPTH`): a `.json` or `.mp` member one level
  too deep is refused by every decoder where one level less is read, and the writer never writes it; a
  manifest nested 10^5 deep or holding NaN, and a `select=` of 5,000 `not`s, are one line, never a
  `RecursionError`. (Members nested 10^5 deep, bombs and lying headers of every kind are the source
  conformance suite's: `wdsprep.conformance.hostile`, read by every reader in a child process.)
- What a member may hold (`codec.MAX_MEMBER_BYTES`, `MAX_NPZ_ENTRIES`) checked before anything is
  inflated or allocated: an `.npz` of too many entries, or of entries declaring too much together; a
  zstd frame that does not declare its size, refused as soon as it passes the bound; an index whose
  sizes run past their sample (refused when it is loaded: nothing is allocated from it); a PAX record
  that would never end. Numpy's own `.npz` files still read as numpy reads them.

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
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import numpy as np
import pytest
import xxhash

import wdsprep
from wdsprep.readoptions import ReadOptions
from wdsprep.errors import FormatError, ManifestError, ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.stream.reading.access import ShardAccess
from wdsprep.stream.reading.read import checked_samples
from wdsprep.stream.reading.readahead import ReadAhead
from wdsprep.testing import RangeHTTPServer
from wdsprep.conformance import read_manifest, run_cli, shard_bytes

from tests.timeouts import EVENT, SUBPROCESS

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


def stranger_shard(directory: pathlib.Path, samples: list[tuple], indexed: bool, sizes_told: dict | None = None) -> dict:
    """A shard of one member per sample `(key, field)` (or `(key, field, data)`; default data: a small
    .npy) named `key.field`, written with tarfile; with `indexed`, its `__wdsprep_index__` by the
    format's rules and the row's index fields (`sizes_told`: {sample number: the size its index gives
    for its member instead of the true one}). Also its manifest. Returns the row."""
    body, offsets, layouts, layout, sizes, digests = bytearray(), [], [], [], [], []
    for i, (key, field, *given) in enumerate(samples):
        data = given[0] if given else _npy(i)
        offsets.append(len(body))
        part = _member(f"{key}.{field}", data)
        if [field] not in layouts:
            layouts.append([field])
        layout.append(layouts.index([field]))
        sizes.append((sizes_told or {}).get(i, len(data)))
        digests.append(xxhash.xxh3_64_intdigest(part))
        body += part
    row = {"name": "train-00000-00.tar", "samples": len(samples)}
    if indexed:
        index = _member("__wdsprep_index__", msgpack.packb({
            "format": "wdsprep-index/2", "digest": "xxh3_64", "keys": [sample[0] for sample in samples], "layouts": layouts,
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


# ------------------------------------------------------------------ nesting, NaN, duplicate keys
def _json_nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def _msgpack_nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"


@pytest.mark.parametrize("field,nested", [("meta.json", _json_nested), ("meta.mp", _msgpack_nested)])
def test_a_member_one_level_deeper_than_the_format_allows_is_refused_one_less_is_read(tmp_path, field, nested):
    from wdsprep.shards.codec import MAX_DEPTH

    value = 1
    for _ in range(MAX_DEPTH):
        value = [value]
    row = stranger_shard(tmp_path / "set", [("ok", field, nested(MAX_DEPTH)), ("deep", field, nested(MAX_DEPTH + 1))], indexed=True)
    manifest = str(tmp_path / "set" / "manifest.json")
    refused = []
    got = {sample["__key__"]: sample["meta"] for sample in wdsprep.dataset(manifest, "train", shuffle_buffer=0).compose(
        wdsprep.decode(strip=True, handler=lambda error: refused.append(str(error)) or True))}
    assert got == {"ok": value}
    assert len(refused) == 1 and row["name"] in refused[0] and f"member deep.{field}: nested deeper than {MAX_DEPTH} levels" in refused[0]
    assert wdsprep.MapDataset(manifest, "train", decode=True)[0][field] == value
    with pytest.raises(ShardError, match=f"member deep.{re.escape(field)}: nested deeper than {MAX_DEPTH} levels"):
        wdsprep.MapDataset(manifest, "train", decode=True)[1]
    name = field if field.endswith(".json") else "meta"  # a dict or list field is written as msgpack
    with pytest.raises(FormatError, match=f"sample 'k', field {name!r}: nested deeper than {MAX_DEPTH} levels"):
        Encoder().encode_fields("k", {name: [value]})
    assert Encoder().encode_fields("k", {name: value})


@pytest.mark.parametrize("text,problem", [('{"loss": NaN}', "NaN is not JSON"), ('{"x": [Infinity]}', "Infinity is not JSON"),
                                          ('{"a": 1, "a": 2}', "duplicate key 'a' in one object")])
def test_json_that_is_not_standard_json_is_refused_in_a_member_and_never_written(tmp_path, text, problem):
    stranger_shard(tmp_path / "set", [("bad", "meta.json", text.encode())], indexed=True)
    with pytest.raises(ShardError, match=f"member bad.meta.json: {re.escape(problem)}"):
        list(wdsprep.dataset(str(tmp_path / "set"), "train").compose(wdsprep.decode()))
    status, _, err = run_cli("verify", tmp_path / "set")
    assert status == 1 and f"member bad.meta.json: {problem}" in err, err
    with pytest.raises(FormatError, match="sample 'k', field 'meta.json': Out of range float values"):
        Encoder().encode_fields("k", {"meta.json": {"loss": float("nan")}})


def test_a_manifest_nested_too_deeply_or_holding_nan_is_one_manifest_error_line(converted, tmp_path):
    from wdsprep.shards.codec import MAX_DEPTH

    manifest = read_manifest(converted)
    cases = {
        "nested 10^5 deep": json.dumps(manifest)[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "nested one level too deep": json.dumps({**manifest, "notes": json.loads(_json_nested(MAX_DEPTH))}),
        "NaN": json.dumps({**manifest, "timing": {"seconds": float("nan")}}),
    }
    for case, text in cases.items():
        work = tmp_path / case.replace(" ", "-").replace("^", "")
        shutil.copytree(converted, work)
        (work / "manifest.json").write_text(text)
        with pytest.raises(ManifestError, match=r"manifest.json: not valid JSON \((nested deeper than 100 levels|NaN is not JSON)"):
            wdsprep.dataset(str(work), "train")
        status, _, err = run_cli("verify", work)
        assert status == 1 and "not valid JSON (" in one_line(err), (case, err)
    with pytest.raises(ValueError, match="Out of range float values"):
        Manifest("t", {"x": float("nan")}, "fp", {"train": []}).dumps()


@pytest.mark.parametrize("nots", [500, 5000])
def test_a_selection_nested_thousands_deep_is_one_config_error_line(converted, nots):
    """5,000 nots: the parser's own recursion limit; 500: the checks and the canonical text would recurse."""
    text = "not " * nots + "index == 1"
    with pytest.raises(wdsprep.ConfigError, match=r"nested deeper than 100 levels"):
        wdsprep.dataset(str(converted), "train", select=text)
    status, _, err = run_cli("inspect", converted, "--select", text)
    assert status == 2 or status == 1, err
    assert "nested deeper than 100 levels" in one_line(err) and len(one_line(err)) < 300, err


# ------------------------------------------------------------------ what a member may hold
def _npz(entries: dict, compression=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_an_npz_of_too_many_entries_is_refused_before_its_directory_is_read():
    from wdsprep.shards.codec import MAX_NPZ_ENTRIES, decode_npz

    small = _npy(1)
    with pytest.raises(FormatError, match=f"{MAX_NPZ_ENTRIES + 1} arrays, more than an .npz member may hold"):
        decode_npz(_npz({f"c{i}.npy": small for i in range(MAX_NPZ_ENTRIES + 1)}))
    arrays = decode_npz(_npz({f"c{i}.npy": small for i in range(MAX_NPZ_ENTRIES)}))
    assert len(arrays) == MAX_NPZ_ENTRIES and all(np.array_equal(a, np.full(3, 1, np.float32)) for a in arrays.values())


def test_npz_entries_declaring_more_than_a_member_together_are_refused_before_anything_is_allocated():
    """Two deflated entries, each declaring (in its .npy header and the zip directory) 600 MiB of zeros
    and holding a few bytes of deflate: each alone is under the cap, together they are not."""
    import tracemalloc
    import zlib as _zlib

    from wdsprep.conformance.hostile import _npy_header, _zip_parts
    from wdsprep.shards.codec import MAX_MEMBER_BYTES, decode_npz

    each = 600 << 20
    header = _npy_header("|u1", (each,))
    stored = _zlib.compress(header + bytes(1024), 9)[2:-4]  # raw deflate of the first KiB only
    data, directory = b"", b""
    for name in ("a.npy", "b.npy"):  # one archive of both: each local header and data, then the directory
        local, tail = _zip_parts(name, 8, len(stored), len(header) + each)
        entry = bytearray(tail[:-22])  # its directory entry, without the end record
        entry[42:46] = struct.pack("<I", len(data))  # where its local header is
        directory += bytes(entry)
        data += local + stored
    data += directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(directory), len(data), 0)
    assert 2 * each > MAX_MEMBER_BYTES > each
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=f"its .npz entries declare {2 * (len(header) + each)} bytes, more than a member may hold"):
            decode_npz(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_npz_files_numpy_writes_decode_as_numpy_reads_them_and_a_damaged_entry_is_refused():
    from wdsprep.shards.codec import decode_npz

    arrays = {"a": np.arange(12, dtype="<i4").reshape(3, 4), "b": np.asfortranarray(np.ones((2, 5), ">f8")), "c": np.zeros(0, "|u1")}
    for save in (np.savez, np.savez_compressed):
        buffer = io.BytesIO()
        save(buffer, **arrays)
        got = decode_npz(buffer.getvalue())
        with np.load(io.BytesIO(buffer.getvalue())) as expected:
            assert sorted(got) == sorted(expected.files)
            for name in got:
                assert got[name].dtype == expected[name].dtype and got[name].flags.writeable
                np.testing.assert_array_equal(got[name], expected[name])
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = bytearray(buffer.getvalue())
    data[data.index(arrays["a"].tobytes()) + 5] ^= 0x01  # a stored entry's data: only its CRC tells
    with pytest.raises(FormatError, match="not a readable .npz .*CRC"):
        decode_npz(bytes(data))


def test_a_zstd_frame_that_does_not_declare_its_size_is_refused_as_soon_as_it_passes_the_bound():
    from wdsprep.conformance.hostile import zstd_frame
    from wdsprep.shards.codec import inflate

    frame = zstd_frame([b"x", 64 << 20], None)  # 64 MiB of zeros, its size undeclared
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=r"its zstd frame holds more than \d+ bytes, more than a test may hold \(1048576 bytes\)"):
            inflate(frame, 1 << 20, "a test")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert inflate(zstd_frame([b"x", 1000], None), 1 << 20) == b"x" + bytes(1000)


def test_the_writer_never_writes_a_member_larger_than_a_member_may_hold():
    from wdsprep.shards.codec import MAX_MEMBER_BYTES, MAX_NPZ_ENTRIES, Columns

    huge = np.broadcast_to(np.zeros(1, np.uint8), (MAX_MEMBER_BYTES + 1,))  # no memory behind it
    for codec in ("none", "zstd"):
        with pytest.raises(FormatError, match=r"sample 'k', field 'x': its header declares a uint8 array .* more than a member may hold"):
            Encoder(codec).encode_fields("k", {"x": huge})
        with pytest.raises(FormatError, match="more than an .npz member may hold"):
            Encoder(codec).encode_fields("k", {"x": Columns({f"c{i}": np.zeros(1) for i in range(MAX_NPZ_ENTRIES + 1)})})


def test_an_index_whose_sizes_run_past_their_sample_is_refused_when_it_is_loaded(tmp_path):
    """The index's sizes column says 7 GiB for a member of a few hundred bytes (offsets, digests and
    the row are consistent): every reader refuses the shard at its index, before it allocates a member."""
    row = stranger_shard(tmp_path / "set", [("a", "x.npy"), ("b", "x.npy"), ("c", "x.npy")], indexed=True, sizes_told={1: 7 << 30})
    path = str(tmp_path / "set" / row["name"])
    rule = r"index: sample 'b' ends at byte \d+, the next one starts at \d+"
    with pytest.raises(ShardError, match=rule):
        ShardAccess([path], [row]).index(0)
    with pytest.raises(ShardError, match=rule):
        list(wdsprep.dataset(str(tmp_path / "set"), "train"))
    with RangeHTTPServer(tmp_path) as server:
        with pytest.raises(ShardError, match=rule):
            list(wdsprep.dataset(server.url_of("set/manifest.json"), "train"))
    status, _, err = run_cli("verify", tmp_path / "set")
    assert status == 1 and re.search(rule, err), err


def test_a_pax_record_that_would_never_end_is_one_shard_error_line(tmp_path):
    """A PAX header whose record says its length is 0 (a reader that trusts it never moves on)."""
    info = tarfile.TarInfo("././@PaxHeader")
    records = b"0 path=k.x.npy\n"
    info.size, info.type = len(records), tarfile.XHDTYPE
    body = info.tobuf(format=tarfile.USTAR_FORMAT) + records + bytes(-len(records) % 512) + _member("k.x.npy", _npy(0))
    (tmp_path / "pax.tar").write_bytes(body + bytes(1024))
    code = "import sys; from wdsprep.stream import iter_shard; list(iter_shard(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "pax.tar")], capture_output=True, text=True, timeout=EVENT)
    assert result.returncode == 1 and "ShardError" in result.stderr and "corrupt PAX header at byte 0" in result.stderr, result.stderr
