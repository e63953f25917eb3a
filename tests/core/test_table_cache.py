"""The node-local table cache (`table_cache_dir`, stream/manifests.py) in a directory it cannot trust:
an entry of the right size but other content, cut short or altered is dropped and fetched again
(one warning line naming it; the dataset reads the manifest's table); a symlink planted at the
temporary name an older wdsprep wrote through is never followed; a symlink, FIFO or directory at an
entry's or a lock's name is refused in one line naming it, without waiting, following or creating
anything; a local table that is a FIFO is refused too. The readers that could block (a FIFO) run in a
child process, bounded by a hang guard."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import wdsprep
from wdsprep.conformance import read_manifest
from wdsprep.shards import shardtable
from wdsprep.testing import RangeHTTPServer
from tests.special_files import KIND_TEXT, make_special
from tests.timeouts import EVENT

from .test_shard_tables import many_shards, without_inline_rows


@pytest.fixture(scope="module")
def tabled(tmp_path_factory):
    """A version-2 conversion (rows only in `train.shards`), its table record and the keys a
    dataset of it gives with seed 2 (read locally, no cache)."""
    root = tmp_path_factory.mktemp("table-cache")
    out = without_inline_rows(many_shards(root), root / "v2")
    record = read_manifest(out)["tables"]["shard_tables"]["train"]
    return out, record, [s["__key__"] for s in wdsprep.dataset(str(out), "train", seed=2)]


def _keys(url: str, cache) -> list[str]:
    return [s["__key__"] for s in wdsprep.dataset(url, "train", seed=2, table_cache_dir=str(cache))]


def _forged(out) -> bytes:
    """A table of the same size as the conversion's but other content: its rows in reverse order
    (a well-formed table whose totals add up: only its sha256 tells it from the real one)."""
    rows = read_manifest(out.parent / "shards" / "generic")["splits"]["train"]["shards"]
    data = shardtable.encode_rows("train", rows[::-1])
    assert len(data) == len((out / "train.shards").read_bytes()) and data != (out / "train.shards").read_bytes()
    return data


@pytest.mark.parametrize("damage", ["same size, other content", "cut short", "one byte flipped"])
def test_a_bad_entry_is_dropped_and_fetched_again(tabled, tmp_path, damage):
    out, record, expected = tabled
    original = (out / "train.shards").read_bytes()
    entry = tmp_path / "cache" / f"{record['sha256']}.shards"
    entry.parent.mkdir()
    if damage == "same size, other content":
        entry.write_bytes(_forged(out))
    elif damage == "cut short":
        entry.write_bytes(original[: len(original) // 2])
    else:
        entry.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    problem = (f"shard table is {len(original) // 2} bytes, the manifest says {len(original)}" if damage == "cut short"
               else "shard table sha256 does not match the manifest")
    with RangeHTTPServer(out) as server:
        url = server.url_of("manifest.json")
        with pytest.warns(UserWarning) as warned:
            assert _keys(url, entry.parent) == expected
        assert [str(w.message) for w in warned] == [
            f"{entry}: cache entry of {server.url_of('train.shards')} does not match the manifest ({problem}); "
            "removed it, fetching the table again"]
        assert len(server.requests_for("train.shards")) == 1
        assert entry.read_bytes() == original
        assert _keys(url, entry.parent) == expected  # the next run maps the healed entry: no request
        assert len(server.requests_for("train.shards")) == 1


def test_a_symlink_at_the_old_temporary_name_is_never_written_through(tabled, tmp_path):
    """An older wdsprep wrote the entry to `<sha256>.shards.<pid>.tmp` (open() with O_TRUNC, following a
    link): a symlink planted there overwrote its target with the table. Now the temporary name is
    unpredictable and created O_EXCL, so the link and its target stay as they were."""
    out, record, expected = tabled
    cache = tmp_path / "cache"
    cache.mkdir()
    planted = cache / f"{record['sha256']}.shards.{os.getpid()}.tmp"
    unchanged = make_special(planted, "symlink", tmp_path / "precious")
    with RangeHTTPServer(out) as server:
        assert _keys(server.url_of("manifest.json"), cache) == expected
    assert unchanged()
    entry = cache / f"{record['sha256']}.shards"
    assert not entry.is_symlink() and entry.read_bytes() == (out / "train.shards").read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == sorted([entry.name, f"{entry.name}.lock", planted.name])


CHILD = """
import sys
import wdsprep
from wdsprep.errors import WdsprepError
try:
    count = sum(1 for _ in wdsprep.dataset(sys.argv[1], "train", seed=2, table_cache_dir=sys.argv[2]))
except WdsprepError as error:
    print(f"{type(error).__name__}: {error}")
    sys.exit(3)
print(count)
"""


def _in_a_child(url: str, cache) -> subprocess.CompletedProcess:
    """A dataset of `url` with the cache made in a child process: a reader that blocks on a FIFO is
    killed by the hang guard (a failure), never left hanging in the suite."""
    return subprocess.run([sys.executable, "-c", CHILD, url, str(cache)], capture_output=True, text=True,
                          timeout=EVENT)


@pytest.mark.parametrize("name, kind", [("entry", "fifo"), ("entry", "symlink"), ("entry", "directory"),
                                        ("lock", "fifo"), ("lock", "symlink")])
def test_what_is_not_a_regular_file_is_refused_in_one_line_without_waiting(tabled, tmp_path, name, kind):
    """A FIFO at an entry's name blocked every reader for ever; a symlink at the lock's name created
    its target (a dangling link here), one at the entry's was followed. Each is refused in one line
    naming it; nothing is created, written or followed."""
    out, record, expected = tabled
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / (f"{record['sha256']}.shards" + (".lock" if name == "lock" else ""))
    elsewhere = tmp_path / "elsewhere"
    if kind == "directory":
        path.mkdir()
        unchanged = path.is_dir
    elif kind == "symlink" and name == "lock":
        os.symlink(elsewhere, path)  # dangling: an open with O_CREAT through it creates `elsewhere`
        unchanged = lambda: path.is_symlink() and not os.path.lexists(elsewhere)  # noqa: E731
    else:  # a FIFO, or a link to a good copy of the table elsewhere
        unchanged = make_special(path, kind, elsewhere, (out / "train.shards").read_bytes())
    with RangeHTTPServer(out) as server:
        child = _in_a_child(server.url_of("manifest.json"), cache)
    text = {"fifo": "a FIFO", "symlink": KIND_TEXT["symlink"], "directory": "a directory"}[kind]
    assert child.returncode == 3, (child.returncode, child.stdout, child.stderr[-2000:])
    assert child.stdout.splitlines() == [
        f"ManifestError: table_cache_dir {cache}: {path}: exists and is {text}, not a regular file; "
        "wdsprep replaces only regular files (remove it or choose another output)"]
    assert unchanged()
    assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]


def test_a_worker_the_table_is_pickled_to_checks_the_entry_it_maps_again(tabled, tmp_path):
    """A spawned DataLoader worker gets the table by its path and maps the file again: one put under
    the entry's name since the dataset checked it (the same size, other content) is refused there in
    one line, not trusted; the good entry maps as before."""
    import pickle

    from wdsprep.errors import ManifestError
    from wdsprep.readoptions import ReadOptions
    from wdsprep.stream.manifests import shard_table

    out, record, expected = tabled
    cache = tmp_path / "cache"
    with RangeHTTPServer(out) as server:
        assert _keys(server.url_of("manifest.json"), cache) == expected  # fills the cache
    # the cached table, as a dataset holds it (a hit: the URL is never asked)
    table = shard_table("http://127.0.0.1:9/manifest.json", record, ReadOptions(table_cache_dir=str(cache)))
    entry = cache / f"{record['sha256']}.shards"
    names = [row["name"] for row in table]
    assert table.path == str(entry) and [row["name"] for row in pickle.loads(pickle.dumps(table))] == names
    (tmp_path / "forged").write_bytes(_forged(out))
    os.replace(tmp_path / "forged", entry)  # replaced since (a new file: the dataset's mapping keeps the old one)
    assert [row["name"] for row in table] == names  # the dataset's own mapping: the file it checked
    with pytest.raises(ManifestError, match=rf"\(cached as {entry}\): shard table sha256 does not match the manifest"):
        pickle.loads(pickle.dumps(table))


def test_a_local_table_that_is_a_fifo_is_refused_without_waiting(tabled, tmp_path):
    """Not the cache but its neighbour: a dataset directory whose `train.shards` is a FIFO blocked
    the reader that mapped it; refused in one line naming it (in a child process, hang-guarded)."""
    import shutil

    out, _, _ = tabled
    work = tmp_path / "work"
    shutil.copytree(out, work)
    (work / "train.shards").unlink()
    os.mkfifo(work / "train.shards")
    child = _in_a_child(str(work), tmp_path / "unused")
    assert child.returncode == 3, (child.returncode, child.stdout, child.stderr[-2000:])
    assert child.stdout.splitlines() == [f"ManifestError: {work}/train.shards: cannot read shard table (a FIFO, not a regular file)"]
