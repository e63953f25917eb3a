"""Shards of a unit that outgrew `--shard-bytes` (rolled over, its last two shards balanced) are
shards like any other: each ends with its index and its manifest row carries the index fields,
and a byte flipped anywhere in any of their samples is refused before that sample is yielded.

Conversions go through the `wdsprep convert` command line; shards are read back with `tarfile`
and `xxhash` (`assert_rows_index_their_shards`), never with wdsprep's own index code.
"""
import json
import pathlib
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import wdsprep
from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.writer import ShardWriter
from wdsprep.conformance import assert_rows_index_their_shards, balanced_units, read_manifest, run_cli

from .shardsets import keys_until_error


def write_small_samples(directory: pathlib.Path, count: int, seed: int = 0) -> pathlib.Path:
    """`count` samples of a 64-float32 `.npy` and a `.json` in `train/` (generic source layout). The
    JSON holds 200 floats written `0.5` (4 bytes each), which msgpack stores in 9: a sample writes ~1.4x
    the bytes its unit was planned by (tar headers and padding included), so every full unit rolls over."""
    rng = np.random.default_rng(seed)
    (directory / "train").mkdir(parents=True)
    weights = "[" + ",".join(["0.5"] * 200) + "]"
    for i in range(count):
        np.save(directory / "train" / f"s{i:05d}.array.npy", rng.standard_normal(64).astype(np.float32))
        (directory / "train" / f"s{i:05d}.meta.json").write_text(f'{{"i":{i},"label":{i % 10},"w":{weights}}}')
    return directory


def units_of(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows by unit (`train-00003-01.tar` -> `train-00003`), in manifest order."""
    units: dict[str, list[dict]] = {}
    for row in rows:
        units.setdefault(row["name"].rsplit("-", 1)[0], []).append(row)
    return units


def convert(native: pathlib.Path, output: pathlib.Path, *options: str) -> None:
    status, _, err = run_cli("convert", "generic", native, output, *options, "--quiet")
    assert status == 0, err


def sample_spans(path: pathlib.Path) -> list[tuple[str, int, int]]:
    """(key, first byte, end) of each sample of a shard, from tarfile's view (the index member excluded)."""
    spans: list[tuple[str, int, int]] = []
    with tarfile.open(path) as archive:
        for info in archive.getmembers():
            if info.name.startswith("__"):
                continue
            key = info.name.split(".", 1)[0]
            end = info.offset_data + info.size + (-info.size % 512)
            if spans and spans[-1][0] == key:
                spans[-1] = (key, spans[-1][1], end)
            else:
                spans.append((key, info.offset, end))
    return spans


def test_the_reproduction_gives_shards_that_all_carry_their_index(tmp_path):
    """4,000 samples of 256 B + a dict at `--shard-bytes 2MB --codec none`: each unit's written bytes
    are ~1.4x its estimate, so each full unit rolls over and its last two shards are balanced."""
    native = write_small_samples(tmp_path / "in", 4000)
    convert(native, tmp_path / "out", "--shard-bytes", "2MB", "--codec", "none")
    rows = read_manifest(tmp_path / "out")["splits"]["train"]["shards"]
    units = units_of(rows)
    rolled = [unit for unit, parts in units.items() if len(parts) > 1]
    assert len(rolled) >= 2  # the full units (the last two may have shared their items: no roll-over)
    assert assert_rows_index_their_shards(tmp_path / "out") == len(rows)
    assert balanced_units(tmp_path / "out", 2_000_000) == rolled
    for unit in rolled:  # equal samples: halving the bytes halves the count
        assert abs(units[unit][-1]["samples"] - units[unit][-2]["samples"]) <= 1
    assert all(row["bytes"] <= 2_000_000 for row in rows)
    keys = [key for row in rows for key, _, _ in sample_spans(tmp_path / "out" / row["name"])]
    assert keys == [f"s{i:05d}" for i in range(4000)]


@pytest.fixture(scope="module")
def rebalanced(tmp_path_factory):
    """A conversion whose units rolled over and were balanced: (output folder, [(shard, spans)])."""
    root = tmp_path_factory.mktemp("rebalanced")
    native = write_small_samples(root / "in", 300, seed=1)
    output = root / "out"
    convert(native, output, "--shard-bytes", "200KB", "--codec", "none")
    assert "train-00000" in balanced_units(output, 200_000)
    rows = read_manifest(output)["splits"]["train"]["shards"]
    assert len(rows) >= 3
    return output, [(row["name"], sample_spans(output / row["name"])) for row in rows]


def test_a_flipped_byte_in_any_sample_of_a_rebalanced_conversion_is_refused_before_that_sample(rebalanced):
    """One sample at a time, in every shard: one byte flipped (its position walks through each
    sample's headers, data and padding), then the split read through `wdsprep.dataset` (raw and
    decoded) and `wdsprep.Loader`: a ShardError naming the shard, and only samples before the
    flipped one, in order, before it (a reader may check ahead of what it yields)."""
    output, shards = rebalanced
    manifest = str(output / "manifest.json")
    order = [key for _, spans in shards for key, _, _ in spans]
    flipped = 0
    for name, spans in shards:
        path = output / name
        original = path.read_bytes()
        for number, (key, start, end) in enumerate(spans):
            at = start + (number * 389) % (end - start)
            data = bytearray(original)
            data[at] ^= 0x04
            path.write_bytes(bytes(data))
            try:
                readers = {
                    "raw": wdsprep.dataset(manifest, "train", shuffle_shards=False),
                    "decoded": wdsprep.dataset(manifest, "train", shuffle_shards=False).compose(wdsprep.decode()),
                    "loader": wdsprep.Loader(wdsprep.dataset(manifest, "train", shuffle_shards=False), batch_size=None),
                }
                for what, reader in readers.items():
                    keys, error = keys_until_error(reader)
                    assert error is not None and name in str(error), (what, name, key, at)
                    assert keys == order[: len(keys)] and len(keys) <= order.index(key), (what, name, key, at)
            finally:
                path.write_bytes(original)
            flipped += 1
    assert flipped == 300


def test_a_flipped_byte_is_refused_through_a_loader_with_workers(rebalanced):
    """The same with 2 DataLoader workers (each reads its own shards): the corrupted shard's worker
    stops before the flipped sample; its error reaches the training loop."""
    output, shards = rebalanced
    name, spans = shards[-2]  # a balanced shard
    key, start, end = spans[len(spans) // 2]
    path = output / name
    original = path.read_bytes()
    data = bytearray(original)
    data[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    try:
        loader = wdsprep.Loader(wdsprep.dataset(str(output / "manifest.json"), "train", shuffle_shards=False),
                                batch_size=None, num_workers=2)
        keys: list[str] = []
        with pytest.raises(Exception, match=name):
            for sample in loader:
                keys.append(sample["__key__"])
        assert key not in keys
    finally:
        path.write_bytes(original)


def _filled(row: dict, shard: list, following: tuple, target: int) -> bool:
    """Whether a shard was closed because the next sample did not fit: its samples, that sample,
    its index with one more entry (at most 512 bytes of padding, the key, 16 bytes a member) and the
    end blocks, less the writer's index estimate's slack (under 2 KiB), exceed the target."""
    key, start, end = following
    return row["index_offset"] + (end - start) + row["index_bytes"] + 512 + len(key) + 64 + 1024 > target - 2048


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 3000), min_size=2, max_size=60), target=st.integers(6_000, 40_000))
@example(sizes=[2433, 2433, 0, 0], target=12289)  # the balance once counted the index framing twice: no move
def test_a_unit_that_rolls_over_never_ends_in_a_needlessly_small_shard(tmp_path_factory, sizes, target):
    """Whatever the sample sizes: shards keep every sample once, in order, within the target (or
    one sample alone), and each ends with its index. Every shard but the last is filled (the next
    sample did not fit), except the second-to-last when the last two were balanced; then, and
    whenever the last shard is under half the target, their boundary is where their sample bytes
    are closest to equal: moving one sample across it either way (within the target) would not
    bring them closer."""
    directory = tmp_path_factory.mktemp("balance")
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=target, encoder=Encoder("none"))
    with writer:
        for i, size in enumerate(sizes):
            writer.write(f"k{i:03d}", {"x": np.zeros(size, np.uint8), "m": {"i": i}})
    rows = [row.as_dict() for row in writer.rows]
    (directory / "manifest.json").write_text(json.dumps({"splits": {"train": {"shards": rows}}}))
    assert assert_rows_index_their_shards(directory) == len(rows)
    spans = [sample_spans(directory / row["name"]) for row in rows]
    assert [key for shard in spans for key, _, _ in shard] == [f"k{i:03d}" for i in range(len(sizes))]
    for row, shard in zip(rows, spans):
        assert row["bytes"] <= target or len(shard) == 1
    for row, shard, after in zip(rows[:-2], spans, spans[1:]):
        assert _filled(row, shard, after[0], target), (row, [e - s for _, s, e in shard])
    if len(rows) < 2:
        return
    balanced = not _filled(rows[-2], spans[-2], spans[-1][0], target)
    if not balanced and rows[-1]["bytes"] >= target / 2:
        return
    assert rows[-1]["bytes"] < target / 2 or balanced
    first = [end - start for _, start, end in spans[-2]]
    last = [end - start for _, start, end in spans[-1]]
    total, cut = sum(first) + sum(last), sum(first)
    gap = abs(total - 2 * cut)
    assert gap <= abs(total - 2 * (cut + last[0])), (first, last)  # taking the next sample back: no closer
    if len(first) > 1:
        more = abs(total - 2 * (cut - first[-1]))  # moving one more sample over: no closer, or over the target
        over = rows[-1]["bytes"] + first[-1] + 512 + 64 > target
        assert gap <= more or over, (first, last, rows[-1]["bytes"])


def test_a_failed_write_while_balancing_leaves_neither_of_the_two_shards_nor_a_temporary(tmp_path, monkeypatch):
    """A full disk during the rewrite of the second unit's two balanced shards: the conversion fails
    with one line, no temporary file stays, the two shards being balanced are not there, and the
    shards that are (complete, as the first unit left them) carry their index."""
    from wdsprep.errors import OutputError
    from wdsprep.shards import writer as writer_module

    native = write_small_samples(tmp_path / "in", 300, seed=1)
    convert(native, tmp_path / "clean", "--shard-bytes", "200KB", "--codec", "none")
    units = units_of(read_manifest(tmp_path / "clean")["splits"]["train"]["shards"])
    balanced = [row["name"] for row in units["train-00001"]][-2:]
    real_finish = writer_module.ShardFile.finish
    finished: list[str] = []

    def finish(self):
        finished.append(self.name)
        if finished.count(self.name) == 2 and self.name in balanced:  # the second unit's balance rewrites it
            raise OutputError(f"{self.temporary}: no space left on the output device (simulated)")
        return real_finish(self)

    monkeypatch.setattr(writer_module.ShardFile, "finish", finish)
    status, _, err = run_cli("convert", "generic", native, tmp_path / "out", "--shard-bytes", "200KB", "--codec", "none", "--quiet")
    assert status == 1 and len(err.strip().splitlines()) == 1 and "no space left" in err, err
    assert finished[-1] == balanced[0]  # the balance had started
    left = sorted(path.name for path in (tmp_path / "out").iterdir() if path.suffix in (".tar", ".tmp"))
    assert left and all(name.endswith(".tar") and name not in balanced for name in left), left
    for name in left:
        with tarfile.open(tmp_path / "out" / name) as archive:
            assert archive.getnames()[-1] == "__wdsprep_index__"
