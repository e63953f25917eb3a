"""The shard table (`<split>.shards`, docs/format.md#the-shard-table-splitshards): written by every
conversion beside manifest.json, it holds the same rows (checked here by a reader of the format
written in this file from the spec, not wdsprep's); a manifest that keeps its rows only there
(version 2) reads exactly as the one with inline rows; older manifests without tables still read;
a truncated or altered table is refused with one line naming it; remote tables are fetched once
and cached by sha256; DataLoader workers neither re-read the manifest nor the table."""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import wdsprep
from wdsprep.cli import main
from wdsprep.conformance import read_manifest, run_cli
from wdsprep.errors import ManifestError
from wdsprep.testing import RangeHTTPServer
from tests.timeouts import SUBPROCESS

from .shardsets import make_older, write_counted_shards

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIPELINES = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase")


# ------------------------------------------------------------------ a reader written from the spec
def spec_rows(path: pathlib.Path) -> tuple[dict, list[dict]]:
    """(header, rows) of a shard table, read as docs/format.md describes it: magic, uint32 header
    length, JSON header, columns at 8-aligned offsets counted from the end of the padded header.
    Rows hold the columns' fields (not the extras)."""
    data = path.read_bytes()
    assert data[:8] == b"WDSSHRD1"
    size = int.from_bytes(data[8:12], "little")
    header = json.loads(data[12 : 12 + size])
    start = 12 + size
    assert start % 8 == 0
    count = header["count"]

    def column(name):
        entry = header["columns"][name]
        width = entry["width"]
        dtype = np.dtype(entry["dtype"])
        items = count * width if name != "names" else int(column("name_ends")[-1]) if count else 0
        array = np.frombuffer(data, dtype=dtype, count=items, offset=start + entry["offset"])
        return array.reshape(count, width) if width > 1 else array

    if header["names"] == "rule":
        names = [f"{header['split']}-{u:05d}-{p:02d}.tar" for u, p in zip(column("name_unit"), column("name_part"))]
    else:
        blob, ends = column("names").tobytes(), [0, *column("name_ends")]
        names = [blob[a:b].decode() for a, b in zip(ends, ends[1:])]
    rows = [{"name": name, "samples": int(s), "bytes": int(b), "sha256": bytes(h).hex()}
            for name, s, b, h in zip(names, column("samples"), column("bytes"), column("sha256"))]
    if "index_bytes" in header["columns"]:
        indexed = column("indexed") if "indexed" in header["columns"] else np.ones(count, bool)
        for row, ok, size_, digest in zip(rows, indexed, column("index_bytes"), column("index_digest")):
            if ok:
                row.update(index_offset=row["bytes"] - int(size_) - 1024, index_bytes=int(size_),
                           index_digest=f"xxh3_64:{int(digest):016x}")
    return header, rows


def without_unit_digest(row: dict) -> dict:
    return {name: value for name, value in row.items() if name != "unit_digest"}


def state_digest(rows: list[dict]) -> str:
    """What a saved state names its dataset by: names, counts and sha256 of the split's shards."""
    return hashlib.sha256(json.dumps([[r["name"], r["samples"], r["sha256"]] for r in rows]).encode()).hexdigest()[:16]


def without_inline_rows(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """A copy of a conversion whose manifest.json keeps only each split's shard count (version 2),
    made here by editing its JSON: the tables are the conversion's own."""
    shutil.copytree(source, target)
    manifest = read_manifest(target)
    manifest["manifest_version"] = 2
    for entry in manifest["splits"].values():
        entry["shards"] = len(entry["shards"])
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


# ------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def every_source(tmp_path_factory):
    """{source: output folder}: each pipeline as `make shards` runs it (CLI), and `generic`
    converted into many small shards (several per unit)."""
    root = tmp_path_factory.mktemp("shard-tables")
    (root / "pipelines").mkdir()
    made = {}
    for source in PIPELINES:
        spec = root / "pipelines" / f"{source}.toml"
        spec.write_bytes((ROOT / "pipelines" / f"{source}.toml").read_bytes())
        assert main(["pipeline", str(spec), "--quiet"]) == 0
        made[source] = root / "shards" / source
    made["generic"] = many_shards(root)
    return made


def many_shards(root: pathlib.Path) -> pathlib.Path:
    from wdsprep.sources.generic.synth import synth

    synth(str(root / "data" / "generic"), 0, splits={"train": 40, "valid": 6})
    out = root / "shards" / "generic"
    status, _, err = run_cli("convert", "generic", root / "data" / "generic", out, "--shard-bytes", "40KB", "--quiet")
    assert status == 0, err
    return out


@pytest.fixture(scope="module")
def generic(tmp_path_factory):
    return many_shards(tmp_path_factory.mktemp("generic-tables"))


# ---------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("source", (*PIPELINES, "generic"))
def test_each_split_table_holds_the_manifest_rows(every_source, source):
    out = every_source[source]
    manifest = read_manifest(out)
    records = manifest["tables"]["shard_tables"]
    assert sorted(records) == sorted(manifest["splits"])
    for split, entry in manifest["splits"].items():
        path = out / f"{split}.shards"
        data = path.read_bytes()
        assert records[split] == {"file": f"{split}.shards", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                  "shards": len(entry["shards"])}
        header, rows = spec_rows(path)
        core = ("name", "samples", "bytes", "sha256", "index_offset", "index_bytes", "index_digest")
        assert rows == [{k: row[k] for k in core if k in row} for row in entry["shards"]]
        assert header["digest"] == state_digest(entry["shards"])
        # wdsprep's own reading gives every field of every row back but unit_digest (the journal's)
        from wdsprep.shards.shardtable import ShardTable

        assert list(ShardTable(data, str(path))) == [without_unit_digest(row) for row in entry["shards"]]
        if source == "generic" and split == "train":
            assert len(rows) >= 10 and header["names"] == "rule"
            columns = sum(np.dtype(c["dtype"]).itemsize * c["width"] for c in header["columns"].values())
            assert columns <= 64 and header["extras"] is None and len(data) < 64 * len(rows) + 1024  # and a header


def test_a_manifest_of_version_2_reads_as_the_inline_one(generic, tmp_path):
    tabled = without_inline_rows(generic, tmp_path / "v2")
    assert (tabled / "manifest.json").stat().st_size < 4096
    for seed, world in ((0, 1), (3, 4)):
        for rank in range(world):
            inline = wdsprep.dataset(str(generic), "train", seed=seed, rank=rank, world_size=world)
            table = wdsprep.dataset(str(tabled), "train", seed=seed, rank=rank, world_size=world)
            assert len(table) == len(inline)
            assert [s["__key__"] for s in table] == [s["__key__"] for s in inline]
            assert table.layout() == inline.layout()
    rows = read_manifest(generic)["splits"]["train"]["shards"]
    assert wdsprep.dataset(str(tabled), "train").digest == state_digest(rows)
    # a state saved on one resumes on the other, mid-epoch
    inline = wdsprep.dataset(str(generic), "train", seed=1)
    it = iter(inline)
    first = [next(it)["__key__"] for _ in range(7)]
    state = inline.state_dict()
    rest = [s["__key__"] for s in it]
    resumed = wdsprep.dataset(str(tabled), "train", seed=1)
    resumed.load_state_dict(state)
    assert [s["__key__"] for s in resumed] == rest and len(first + rest) == len(inline)
    assert run_cli("verify", tabled, "--quiet")[0] == 0


def test_uneven_shards_deal_the_same_from_the_table(tmp_path):
    """Shards of 7,7,7,7,7,7,7,1 and one empty: every rank's samples, for several worlds and seeds,
    from the table (version 2) and from inline rows, and len() on each."""
    from wdsprep.shards.manifest import Manifest
    from wdsprep.storage import open_store

    manifest_path = write_counted_shards(tmp_path / "inline", [7, 7, 7, 0, 7, 7, 7, 7, 1], codec="none")
    inline = pathlib.Path(manifest_path).parent
    shutil.copytree(inline, tmp_path / "v2")
    Manifest.loads((inline / "manifest.json").read_bytes(), str(inline / "manifest.json")).write(
        open_store(str(tmp_path / "v2")), inline_shards=0)
    assert read_manifest(tmp_path / "v2")["manifest_version"] == 2
    for seed, world, equalize in ((0, 3, "pad"), (2, 4, "drop"), (5, 7, None)):
        for rank in range(world):
            options = dict(seed=seed, rank=rank, world_size=world, equalize=equalize)
            a = wdsprep.dataset(str(inline), "train", **options)
            b = wdsprep.dataset(str(tmp_path / "v2"), "train", **options)
            assert len(a) == len(b)
            assert [s["__key__"] for s in a] == [s["__key__"] for s in b]


def test_a_manifest_without_tables_still_reads(generic, tmp_path):
    older = tmp_path / "older"
    shutil.copytree(generic, older)
    manifest = read_manifest(older)
    for split in manifest["tables"].pop("shard_tables"):
        (older / f"{split}.shards").unlink()
    (older / "manifest.json").write_text(json.dumps(manifest))
    keys = [s["__key__"] for s in wdsprep.dataset(str(older), "train", seed=5)]
    assert keys == [s["__key__"] for s in wdsprep.dataset(str(generic), "train", seed=5)]
    make_older(older)  # and shards without their index
    assert len(list(wdsprep.dataset(str(older), "train", seed=5))) == len(keys)


def _one_line_from_cli(location) -> str:
    child = subprocess.run([sys.executable, "-m", "wdsprep", "inspect", str(location)], capture_output=True,
                           text=True, timeout=SUBPROCESS)
    assert child.returncode == 1, child
    assert len(child.stderr.splitlines()) == 1, child.stderr
    return child.stderr


@pytest.mark.parametrize("damage", ["truncated", "altered", "emptied"])
def test_a_damaged_table_is_refused_naming_it(generic, tmp_path, damage):
    tabled = without_inline_rows(generic, tmp_path / "v2")
    path = tabled / "train.shards"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) - 8]
    elif damage == "altered":
        data[-40] ^= 1  # a byte of a column: same size
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError) as raised:
        wdsprep.dataset(str(tabled), "train")
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"{path}: shard table")
    assert _one_line_from_cli(tabled).startswith(f"wdsprep: error: {path}: shard table")
    # with inline rows, the table is not read to stream; `verify` names it
    inline = tmp_path / "inline"
    shutil.copytree(generic, inline)
    (inline / "train.shards").write_bytes(bytes(data))
    status, out, err = run_cli("verify", inline)
    assert status == 1 and f"{inline / 'train.shards'}: shard table" in out + err


def test_a_consistent_but_lying_table_is_refused(generic, tmp_path):
    """A table and a manifest record made to agree (sha256 and size) but whose rows break the rules
    the inline rows obey: a name twice, a count that does not add up, an index outside its shard."""
    from wdsprep.shards import shardtable

    rows = read_manifest(generic)["splits"]["train"]["shards"]
    cases = {
        "listed twice": [rows[0], *rows[1:-1], dict(rows[-1], name=rows[0]["name"])],
        "adds up to": [dict(rows[0], samples=rows[0]["samples"] + 1), *rows[1:]],
        "does not lie within": [dict(rows[0], index_bytes=rows[0]["bytes"], index_offset=-1024), *rows[1:]],
    }
    for problem, lying in cases.items():
        tabled = without_inline_rows(generic, tmp_path / problem.replace(" ", "-"))
        data = shardtable.encode_rows("train", lying)
        (tabled / "train.shards").write_bytes(data)
        manifest = read_manifest(tabled)
        manifest["tables"]["shard_tables"]["train"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (tabled / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ManifestError, match=problem) as raised:
            wdsprep.dataset(str(tabled), "train")
        assert "\n" not in str(raised.value)


def test_an_older_reader_is_told_the_version(generic, tmp_path):
    """A version this wdsprep does not know is one line naming it (what an older wdsprep says of 2)."""
    tabled = without_inline_rows(generic, tmp_path / "v3")
    manifest = read_manifest(tabled)
    manifest["manifest_version"] = 3
    (tabled / "manifest.json").write_text(json.dumps(manifest))
    assert "manifest version 3 is not supported" in _one_line_from_cli(tabled)


def test_a_remote_table_is_fetched_once_and_cached_by_its_sha256(generic, tmp_path):
    tabled = without_inline_rows(generic, tmp_path / "v2")
    cache = tmp_path / "cache"
    record = read_manifest(tabled)["tables"]["shard_tables"]["train"]
    with RangeHTTPServer(tabled) as server:
        url = server.url_of("manifest.json")
        expected = [s["__key__"] for s in wdsprep.dataset(str(tabled), "train", seed=2)]
        assert [s["__key__"] for s in wdsprep.dataset(url, "train", seed=2)] == expected
        assert len(server.requests_for("train.shards")) == 1  # no cache: once, kept in memory
        for _ in range(3):
            dataset = wdsprep.dataset(url, "train", seed=2, table_cache_dir=str(cache))
        assert [s["__key__"] for s in dataset] == expected
        assert len(server.requests_for("train.shards")) == 2  # once more, then from the cache
        original = (tabled / "train.shards").read_bytes()
        assert (cache / f"{record['sha256']}.shards").read_bytes() == original
        # the dataset changes at the same URL (a new conversion: fewer shards): its table is another
        # sha256, so it is fetched, not the cached one taken
        from wdsprep.shards import shardtable

        rows = read_manifest(generic)["splits"]["train"]["shards"][:-3]
        data = shardtable.encode_rows("train", rows)
        (tabled / "train.shards").write_bytes(data)
        manifest = read_manifest(tabled)
        manifest["tables"]["shard_tables"]["train"] = shardtable.entry_for("train", data, len(rows))
        manifest["splits"]["train"].update(shards=len(rows), samples=sum(r["samples"] for r in rows),
                                           bytes=sum(r["bytes"] for r in rows))
        manifest.pop("totals")
        (tabled / "manifest.json").write_text(json.dumps(manifest))
        changed = wdsprep.dataset(url, "train", seed=2, equalize=None, table_cache_dir=str(cache))
        assert len(changed) == sum(r["samples"] for r in rows)
        assert len(server.requests_for("train.shards")) == 3
        # back to the first conversion, whose cache entry was cut short meanwhile: dropped and fetched
        # again, with one warning line naming it (tests/core/test_table_cache.py: other damage)
        (tabled / "train.shards").write_bytes(original)
        (cache / f"{record['sha256']}.shards").write_bytes(original[:-1])
        manifest["tables"]["shard_tables"]["train"] = record
        manifest["splits"]["train"] = read_manifest(generic)["splits"]["train"] | {"shards": record["shards"]}
        (tabled / "manifest.json").write_text(json.dumps(manifest))
        with pytest.warns(UserWarning, match=rf"{record['sha256']}\.shards: cache entry of .*train\.shards does not match"):
            healed = wdsprep.dataset(url, "train", seed=2, table_cache_dir=str(cache))
        assert [s["__key__"] for s in healed] == expected
        assert len(server.requests_for("train.shards")) == 4
        assert (cache / f"{record['sha256']}.shards").read_bytes() == original


def passthrough(samples):
    """A reader stage of the user's (not fused into the reader): each sample as it is."""
    yield from samples


def test_a_remote_rank_needs_two_requests_besides_its_first_shards(generic, tmp_path):
    """With a stage of the user's composed: before a rank's first sample, manifest.json and the
    table, then only the shards holding its first two samples (with stages, the stream makes one
    sample before it hands over the one before), at most two requests each (index, body): the
    read-ahead starts with the first block's pieces only."""
    tabled = without_inline_rows(generic, tmp_path / "v2")
    rows = read_manifest(generic)["splits"]["train"]["shards"]
    with RangeHTTPServer(tabled) as server:
        url = server.url_of("manifest.json")
        for rank in (0, 5, 7):
            server.clear_log()
            dataset = wdsprep.dataset(url, "train", seed=4, rank=rank, world_size=8).compose(passthrough)
            pieces = dataset.plan(0, 1).pieces
            first_two = []
            for piece in pieces:
                first_two += [rows[piece.shard]["name"]] * (piece.stop - piece.start)
            next(iter(dataset))
            asked = [r["name"] for r in server.requests]
            assert sorted(name for name in asked if not name.endswith(".tar")) == ["manifest.json", "train.shards"]
            shards = [name for name in asked if name.endswith(".tar")]
            assert set(shards) <= set(first_two[:2]), (shards, first_two[:2])
            assert all(shards.count(name) <= 2 for name in shards)


def model_first_sample(counts: list[int], seed: int, epoch: int, world: int, rank: int) -> tuple[int, int]:
    """(shard, sample number) of a rank's first sample, from the reference model of the dealing
    (test_plan_oracle.py: the shard order of (seed, epoch), then contiguous runs by the divmod rule)."""
    from .test_plan_oracle import model_contiguous_run, model_shard_order

    items = [(shard, i) for shard in model_shard_order(len(counts), seed, epoch, True) for i in range(counts[shard])]
    return model_contiguous_run(items, world, rank)[0]


@pytest.mark.parametrize("decoded", [False, True])
def test_a_remote_rank_needs_its_first_shard_only_even_when_it_holds_one_of_its_samples(generic, tmp_path, decoded):
    """Every rank of several worlds, the ranks whose first piece is the last sample of a shard among
    them: before its first sample (raw, or decoded in the reader) the server answers manifest.json,
    the table, and its first shard (index and body: at most two requests), four requests at most.
    The stream hands a sample over before it reads the next, so the next piece is not requested yet."""
    tabled = without_inline_rows(generic, tmp_path / "v2")
    rows = read_manifest(generic)["splits"]["train"]["shards"]
    counts = [row["samples"] for row in rows]
    one_sample_pieces = 0
    with RangeHTTPServer(tabled) as server:
        url = server.url_of("manifest.json")
        for world in (3, 7, 8, 13):
            for rank in range(world):
                shard, index = model_first_sample(counts, 4, 0, world, rank)
                one_sample_pieces += index == counts[shard] - 1
                server.clear_log()
                dataset = wdsprep.dataset(url, "train", seed=4, rank=rank, world_size=world)
                if decoded:
                    dataset = dataset.compose(wdsprep.decode(bookkeeping=True))
                sample = next(iter(dataset))
                asked = [r["name"] for r in server.requests]
                assert sample["__url__"].endswith(rows[shard]["name"]) and sample["__index__"] == index
                assert len(asked) <= 4, (world, rank, asked)
                assert sorted(name for name in asked if not name.endswith(".tar")) == ["manifest.json", "train.shards"]
                assert [name for name in asked if name.endswith(".tar")] in ([rows[shard]["name"]] * 2, [rows[shard]["name"]])
    assert one_sample_pieces >= 5  # the case of the issue was met, several times


def test_loader_workers_read_neither_manifest_nor_table_again(generic, tmp_path):
    """Workers get the planned dataset from the main process: with `spawn` (the dataset pickled) the
    server sees manifest.json and the table once for the whole epoch of 2 workers."""
    tabled = without_inline_rows(generic, tmp_path / "v2")
    with RangeHTTPServer(tabled) as server:
        url = server.url_of("manifest.json")
        dataset = wdsprep.dataset(url, "train", seed=1)
        loader = wdsprep.Loader(dataset, batch_size=4, num_workers=2, multiprocessing_context="spawn")
        batches = list(loader)
        assert sum(len(b["__key__"]) for b in batches) == len(dataset)
        assert len(server.requests_for("manifest.json")) == 1
        assert len(server.requests_for("train.shards")) == 1
        assert not server.requests_for("valid.shards")  # a split nobody asked for is not read


def test_planning_a_hundred_thousand_shards_makes_no_object_per_shard(tmp_path):
    """A version 2 manifest of 10^5 shards: dataset, len() and a rank's plan within a bound that
    one Python object per shard would break (~100 bytes each = 10 MB), counted by tracemalloc."""
    from wdsprep.shards import shardtable

    count = 100_000
    rng = np.random.default_rng(0)
    columns = {"name_unit": np.arange(count, dtype="<u4"), "name_part": np.zeros(count, "<u2"),
               "samples": np.full(count, 10, "<u8"), "bytes": np.full(count, 1 << 20, "<u8"),
               "sha256": rng.integers(0, 256, (count, 32), dtype=np.uint8),
               "index_bytes": np.full(count, 1024, "<u4"), "index_digest": rng.integers(0, 1 << 62, count).astype("<u8")}
    data = shardtable.encode_columns("train", columns, digest="0" * 16)
    (tmp_path / "train.shards").write_bytes(data)
    manifest = {"format": "wdsprep/2", "manifest_version": 2, "source": "generic", "config": {}, "fingerprint": "",
                "splits": {"train": {"shards": count, "samples": 10 * count, "bytes": count << 20}},
                "tables": {"shard_tables": {"train": shardtable.entry_for("train", data, count)}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    tracemalloc.start()
    dataset = wdsprep.dataset(str(tmp_path), "train", rank=3, world_size=8)
    assert len(dataset) == 10 * count // 8
    plan = dataset.plan(0, 1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert plan is not None
    assert peak < 8 * count * 8 + (4 << 20), peak  # a few int64 columns, no per-shard objects


def test_a_version_2_dataset_uploads_and_reads_back(generic, tmp_path):
    """`wdsprep upload` of a manifest without inline rows carries its tables; the copy reads the same."""
    tabled = without_inline_rows(generic, tmp_path / "v2")
    status, _, err = run_cli("upload", tabled, f"file://{tmp_path / 'copy'}", "--quiet")
    assert status == 0, err
    assert (tmp_path / "copy" / "train.shards").read_bytes() == (tabled / "train.shards").read_bytes()
    expected = [s["__key__"] for s in wdsprep.dataset(str(generic), "valid", seed=3)]
    assert [s["__key__"] for s in wdsprep.dataset(str(tmp_path / "copy"), "valid", seed=3)] == expected
