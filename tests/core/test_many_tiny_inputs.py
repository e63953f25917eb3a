"""Many tiny inputs (issue 40): a source finding more small files than one unit may hold plans several
units that `--workers` build at once, never one giant unit; the units keep every input once, in order.

The planner (`group_by_size`) is checked under hypothesis against the rules written out here; the
command line's shards are read back with `tarfile` and numpy and compared with the files the test wrote."""
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.timeouts import SUBPROCESS
from wdsprep.sources.base import MAX_UNIT_ITEMS, PLAN_FILL, group_by_size


@settings(max_examples=300, deadline=None)
@given(target=st.integers(1, 50_000), max_items=st.integers(1, 40), data=st.data())
def test_every_item_in_one_group_in_order_and_no_group_above_the_bounds(target, max_items, data):
    sizes = data.draw(st.lists(st.integers(0, 60_000), max_size=300))
    groups = group_by_size(list(range(len(sizes))), sizes, target, max_items=max_items)
    assert [i for group in groups for i in group] == list(range(len(sizes)))  # each once, consecutive, in order
    assert all(0 < len(group) <= max_items for group in groups)
    limit = max(1, int(target * PLAN_FILL))
    assert all(len(group) == 1 or sum(sizes[i] for i in group) <= limit for group in groups)
    # no needless cut (the last one may move: the tail's rebalance): only where the next item would
    # break a bound
    for group, after in zip(groups[:-2], groups[1:-1]):
        assert len(group) == max_items or sum(sizes[i] for i in group) + sizes[after[0]] > limit


def test_a_split_of_tiny_items_is_cut_by_count_whatever_their_bytes():
    n = 3 * MAX_UNIT_ITEMS + 5
    groups = group_by_size(list(range(n)), [1] * n, 1 << 40)
    assert [len(group) for group in groups] == [MAX_UNIT_ITEMS] * 3 + [5]


def _tiny_input(root, count):
    """`count` samples of one 16-float32 array file each (192 bytes: mostly a tar header when written)."""
    rng = np.random.default_rng(40)
    arrays = rng.standard_normal((count, 16)).astype(np.float32)
    os.makedirs(root / "train")
    for i, array in enumerate(arrays):
        np.save(root / "train" / f"s{i:06d}.x.npy", array)
    return arrays


def _convert(native, output, *options):
    command = [sys.executable, "-m", "wdsprep", "convert", "generic", str(native), str(output), "--quiet", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SUBPROCESS)
    assert done.returncode == 0, done.stderr
    return json.loads((output / "manifest.json").read_text())


def _tar_samples(path):
    """(key, array) of every sample of a shard, by tarfile and numpy (the index member left out)."""
    with tarfile.open(path) as archive:
        members = [m for m in archive.getmembers() if not m.name.startswith("__")]
        return [(m.name.split(".")[0], np.load(io.BytesIO(archive.extractfile(m).read()))) for m in members]


def test_many_tiny_files_convert_in_several_units_and_equal_the_input(tmp_path):
    count = 2 * MAX_UNIT_ITEMS + 100  # far below the default 256MB shard: one unit before issue 40
    arrays = _tiny_input(tmp_path / "in", count)
    manifest = _convert(tmp_path / "in", tmp_path / "out", "--codec", "none", "--workers", "2")
    rows = manifest["splits"]["train"]["shards"]
    assert len({row["unit"] for row in rows}) == 3 == manifest["timing"]["units_built"]
    samples = [sample for row in rows for sample in _tar_samples(tmp_path / "out" / row["name"])]
    assert [key for key, _ in samples] == [f"s{i:06d}" for i in range(count)]
    for (key, array), expected in zip(samples, arrays):
        np.testing.assert_array_equal(array, expected, err_msg=key)


def test_tiny_files_are_planned_by_their_written_bytes(tmp_path):
    """A unit of tiny files is sized by what they take in a tar (a header and padding each), so it
    makes one shard near the target instead of rolling over into many parts."""
    count = 400
    _tiny_input(tmp_path / "in", count)
    manifest = _convert(tmp_path / "in", tmp_path / "out", "--codec", "none", "--shard-bytes", "64KB")
    rows = manifest["splits"]["train"]["shards"]
    names = [row["name"] for row in rows]
    assert all(name.endswith("-00.tar") for name in names), names  # no unit rolled over
    assert all(os.path.getsize(tmp_path / "out" / name) <= 64_000 for name in names)
    assert sum(os.path.getsize(tmp_path / "out" / name) < 32_000 for name in names) <= 1
