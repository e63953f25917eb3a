"""One member check, one wording: a local shard cut after its index was read is the same one line
from random access (`wdsprep.MapDataset`, what `wdsprep show` and `inspect` read with) and from the
streaming reader (`read_samples`, what `wdsprep.dataset` reads with): the bytes of the sample asked
for, and the byte the shard ends at, as Python's own `tarfile` places that sample (shards made by
`wdsprep convert generic`)."""
import re
import shutil
import tarfile

import pytest

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.stream.reading.read import read_samples

from .mapsources import convert_source


@pytest.fixture(scope="module")
def generic(tmp_path_factory):
    return convert_source("generic", tmp_path_factory.mktemp("member_check"))


def _spans(path) -> list[tuple[str, int, int]]:
    """(key, first header byte, end byte) of each sample of a shard, by `tarfile` alone."""
    spans: list[list] = []
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            if member.name.startswith("__"):
                continue
            key = member.name.partition(".")[0]
            end = member.offset_data + member.size + (-member.size % 512)
            if spans and spans[-1][0] == key:
                spans[-1][2] = end
            else:
                spans.append([key, member.offset, end])
    return [tuple(span) for span in spans]


def _cut_shard(generic, tmp_path):
    """A MapDataset over a copy of the shards whose index of one shard was read, that shard then cut
    in the middle of its last sample: (dataset, shard number, its path, the last sample's position,
    first byte and end, the cut)."""
    out, split = generic
    copy = tmp_path / "shards"
    shutil.copytree(out, copy)
    ds = wdsprep.MapDataset(copy, split, decode=False)
    shard = next(number for number, count in enumerate(ds.counts.tolist()) if count >= 3)
    path = ds.urls[shard]
    key, first, end = _spans(path)[-1]
    position = int(ds.counts[: shard + 1].sum()) - 1
    assert ds.read([position])[0]["__key__"] == key  # read whole before the cut: its index is kept
    cut = first + (end - first) // 2
    with open(path, "r+b") as file:
        file.truncate(cut)
    return ds, shard, path, position, first, end, cut


def test_a_shard_cut_after_its_index_was_read_is_one_line_from_random_access(generic, tmp_path):
    ds, _, path, position, first, end, cut = _cut_shard(generic, tmp_path)
    line = f"truncated shard: bytes {first}-{end - 1} end at byte {cut}: cut or rewritten while being read"
    with pytest.raises(ShardError, match=re.escape(line)) as caught:
        ds.read([position])
    assert path in str(caught.value) and "\n" not in str(caught.value)


def test_the_streaming_reader_says_the_same_line(generic, tmp_path):
    ds, shard, path, position, first, end, cut = _cut_shard(generic, tmp_path)
    row, index = ds.access.rows[shard], ds.access.index(shard)
    number = len(index) - 1
    with open(path, "rb") as stream, pytest.raises(ShardError) as caught:
        list(read_samples(path, row, number, number + 1, stream, index=index))
    with pytest.raises(ShardError) as random_access:
        ds.read([position])
    assert str(caught.value) == str(random_access.value)
    assert f"bytes {first}-{end - 1} end at byte {cut}" in str(caught.value)
