"""Synthetic data end to end (synth -> convert -> stream), blocks, and exact mid-epoch resume."""
import numpy as np
import pytest
import webdataset as wds

import wdsprep
from wdsprep.conversion import convert
from wdsprep.shards.codec import Encoder
from wdsprep.sources.base import PlanContext, UnitContext
from wdsprep.sources.deepreg import SOURCE, pairs
from wdsprep.stream import load_manifest


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    native = tmp_path_factory.mktemp("native")
    SOURCE.synth(str(native), 0, "small")
    output = tmp_path_factory.mktemp("shards")
    manifest = convert("deepreg", str(native), str(output), shard_bytes="64MB")
    return native, output / "manifest.json", manifest


def test_synth_covers_all_types_and_formats(synthetic):
    _, url, manifest = synthetic
    counts = {split: manifest.samples(split) for split in manifest.splits}
    for fmt in ("nifti", "h5"):
        assert counts[f"paired_{fmt}_train"] == 4
        assert counts[f"unpaired_{fmt}_train"] == 5
        assert counts[f"grouped_{fmt}_train"] == 3
        for split in ("train", "valid", "test"):
            assert f"paired_{fmt}_{split}" in counts
    for name in manifest.splits:
        kind = name.split("_")[0]
        shape = {"paired": dict(moving_image_shape=(8, 8, 8), fixed_image_shape=(6, 6, 6))}.get(
            kind, dict(image_shape=(8, 8, 8)))
        samples = list(wds.WebDataset(wdsprep.urls(str(url), name), shardshuffle=False).compose(
            pairs(kind, sample_label="all", seed=0, **shape)))
        assert samples, name
        for sample in samples:
            assert sample["moving_image"].shape == shape.get("moving_image_shape", (8, 8, 8))
            assert sample["fixed_label"].shape == shape.get("fixed_image_shape", (8, 8, 8))
            assert 0 <= sample["moving_image"].min() and sample["moving_image"].max() <= 1
    train = load_manifest(str(url)).tables["splits"]["grouped_nifti_train"]
    assert train["group_struct"] == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]


def test_synth_paired_label_counts_follow_the_files(synthetic):
    _, url, _ = synthetic
    samples = list(wds.WebDataset(wdsprep.urls(str(url), "paired_h5_train"), shardshuffle=False).compose(
        pairs("paired", sample_label="all", seed=0)))
    per_pair = {}
    for sample in samples:
        per_pair.setdefault(int(sample["indices"][0]), []).append(int(sample["indices"][1]))
    assert per_pair == {0: [0, 1, 2], 1: [0, 1], 2: [0], 3: [0, 1, 2]}


def test_stage_accepts_in_memory_samples_from_build(synthetic):
    native, _, _ = synthetic
    plan = SOURCE.plan(str(native), PlanContext({"shard_bytes": 1 << 30}))
    unit = next(u for u in plan.units if u.split == "unpaired_nifti_train")
    encoder = Encoder("zstd", 3)
    raw = [{"__key__": key, **dict(encoder.encode_fields(key, fields))}
           for key, fields in SOURCE.build(unit, UnitContext({"on_error": "raise"}))]
    outputs = list(pairs("unpaired", image_shape=(4, 4, 4), seed=0)(iter(raw)))
    assert len(outputs) == 2  # 5 images -> floor(5/2)
    decoded = [wdsprep.decode_sample(s) for s in raw]
    again = list(pairs("unpaired", image_shape=(4, 4, 4), seed=0)(iter(decoded[::-1])))
    assert len(again) == len(outputs)
    for a, b in zip(outputs, again):  # arrival order inside a block does not matter
        np.testing.assert_array_equal(a["indices"], b["indices"])
        np.testing.assert_array_equal(a["moving_image"], b["moving_image"])


def _unpaired_multi_shard(deepreg_data, tmp_path_factory):
    output = tmp_path_factory.mktemp("unpaired-multi")
    manifest = convert("deepreg", str(deepreg_data / "nifti/unpaired"), str(output), shard_bytes="1MB",
                       deepreg_labeled="false")
    return output / "manifest.json", manifest


def test_unpaired_units_hold_even_image_counts(deepreg_data, tmp_path_factory):
    url, manifest = _unpaired_multi_shard(deepreg_data, tmp_path_factory)
    rows = manifest.shards("train")
    assert len(rows) > 1
    assert all(row["samples"] % 2 == 0 for row in rows[:-1])
    samples = list(wds.WebDataset(wdsprep.urls(str(url), "train"), shardshuffle=False).compose(
        pairs("unpaired", labeled=False, image_shape=(4, 4, 4))))
    assert len(samples) == 7


@pytest.mark.parametrize("kind,options", [
    ("unpaired", dict(image_shape=(4, 4, 4), labeled=False)),
    ("unpaired", dict(image_shape=(4, 4, 4), labeled=False, block_size=4)),
    ("grouped", dict(image_shape=(4, 4, 4), labeled=False, sample_image_in_group=False, intra_group_prob=0)),
    ("paired", dict(moving_image_shape=(4, 4, 4), fixed_image_shape=(4, 4, 4), sample_label="all")),
])
def test_mid_block_resume_is_exact(deepreg_data, tmp_path_factory, converted, kind, options):
    if kind == "unpaired":
        url, _ = _unpaired_multi_shard(deepreg_data, tmp_path_factory)
    else:
        url = converted({"grouped": "nifti_grouped_unlabeled", "paired": "nifti_paired"}[kind])

    def build():
        return wdsprep.dataset(str(url), "train", seed=3, epoch=1, equalize=None).compose(
            pairs(kind, epoch=1, **options))

    full = [s["__key__"] for s in build()]
    assert len(full) == {"unpaired": 7, "grouped": 24, "paired": 58}[kind]
    for stop in [s for s in (1, 2, 5, 13) if s < len(full)]:
        first = build()
        iterator = iter(first)
        taken = [next(iterator)["__key__"] for _ in range(stop)]
        state = first.state_dict()
        second = build()
        second.load_state_dict(state)
        assert taken + [s["__key__"] for s in second] == full, stop


@pytest.mark.parametrize("equalize", [None, "pad"])
def test_mid_block_resume_with_two_loader_workers_is_exact(deepreg_data, tmp_path_factory, equalize):
    url, _ = _unpaired_multi_shard(deepreg_data, tmp_path_factory)

    def build():
        dataset = wdsprep.dataset(str(url), "train", seed=3, epoch=1, equalize=equalize, rank=0, world_size=2).compose(
            pairs("unpaired", epoch=1, image_shape=(4, 4, 4), labeled=False))
        return wdsprep.Loader(dataset, batch_size=1, num_workers=2, collate_fn=lambda batch: batch[0]["__key__"])

    full = list(build())
    assert len(full) == len(set(full)) or equalize == "pad"
    for stop in (1, 2, 3):
        first = build()
        iterator = iter(first)
        taken = [next(iterator) for _ in range(stop)]
        state = first.state_dict()
        del iterator
        second = build()
        second.load_state_dict(state)
        assert taken + list(second) == full, stop


def test_loader_with_workers_batches_with_collate(synthetic):
    _, url, _ = synthetic
    dataset = wdsprep.dataset(str(url), "paired_nifti_train", seed=0, epoch=0, equalize=None).compose(
        pairs("paired", moving_image_shape=(8, 8, 8), fixed_image_shape=(6, 6, 6), sample_label="all", seed=0))
    loader = wdsprep.Loader(dataset, batch_size=3, num_workers=2, collate_fn=wdsprep.deepreg.collate)
    batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == 3 + 2 + 1 + 3  # label counts (3, 2, 3-D, 3)
    assert all(tuple(b["moving_image"].shape[1:]) == (8, 8, 8) for b in batches)
    assert all(tuple(b["fixed_label"].shape[1:]) == (6, 6, 6) for b in batches)


def test_stream_starting_inside_a_block(synthetic):
    """Mid-block starts: recovered from the shard (resume), or not (a piece that starts there)."""
    from wdsprep.stream import iter_shard

    _, url, _ = synthetic
    shard = wdsprep.urls(str(url), "unpaired_nifti_train")[0]
    samples = list(iter_shard(shard))
    assert len(samples) == 5
    stage = dict(image_shape=(4, 4, 4), seed=0)
    full = [s["__key__"] for s in pairs("unpaired", **stage)(iter(samples))]
    assert len(full) == 2
    resumed = [s["__key__"] for s in pairs("unpaired", **stage)(iter(samples[3:]))]
    assert resumed == full  # the block's first three images were re-read from the shard
    own_piece = [dict(s, __piece_start__=3) for s in samples[3:]]
    alone = [s["__key__"] for s in pairs("unpaired", **stage)(iter(own_piece))]
    assert len(alone) == 1 and alone[0] in ("pair_3_4/label_0", "pair_4_3/label_0", "pair_3_4/label_1",
                                            "pair_4_3/label_1", "pair_3_4/label_2", "pair_4_3/label_2")


def test_plain_webdataset_epochs_differ_without_seed(synthetic):
    """DeepReg's train default (seed=None) draws afresh every epoch, also without wdsprep.dataset."""
    _, url, _ = synthetic
    urls = wdsprep.urls(str(url), "unpaired_nifti_train")

    def two_epochs(seed):
        dataset = wds.WebDataset(urls, shardshuffle=False).compose(
            pairs("unpaired", image_shape=(4, 4, 4), labeled=False, seed=seed))
        return [[tuple(s["indices"]) for s in dataset] for _ in range(2)]

    first, second = two_epochs(None)
    assert len(first) == len(second) == 2  # floor(5 / 2) pairs per epoch
    fixed = two_epochs(0)
    assert fixed[0] == fixed[1]
    assert first != second  # epochs 0 and 1 (deterministic for this data)


def test_a_block_recovered_from_a_corrupted_shard_is_a_shard_error(tmp_path):
    """A stream starting inside a block re-reads the block's start from the shard, checked like every
    read: converted by the CLI without compression, one byte flipped in each member of the samples
    re-read in turn, the stage raises a ShardError naming the shard before it yields any pair."""
    from tests.core.shardsets import each_member_flipped
    from wdsprep.stream import iter_shard
    from wdsprep.conformance import run_cli

    SOURCE.synth(str(tmp_path / "native"), 0, "small")
    status, _, err = run_cli("convert", "deepreg", tmp_path / "native", tmp_path / "out", "--codec", "none", "--quiet")
    assert status == 0, err
    shard = wdsprep.urls(str(tmp_path / "out"), "unpaired_nifti_train")[0]
    samples = list(iter_shard(shard))  # read while intact
    re_read = [sample["__key__"] for sample in samples[:3]]
    stage = dict(image_shape=(4, 4, 4), seed=0)
    intact = [s["__key__"] for s in pairs("unpaired", **stage)(iter(samples))]
    assert [s["__key__"] for s in pairs("unpaired", **stage)(iter(samples[3:]))] == intact  # recovered
    flipped = 0
    for path, key, member in each_member_flipped(tmp_path / "out", "unpaired_nifti_train-*.tar",
                                                 keep=lambda key, member: key in re_read):
        flipped += 1
        yielded = []
        with pytest.raises(wdsprep.ShardError, match=path.name):
            for pair in pairs("unpaired", **stage)(iter(samples[3:])):
                yielded.append(pair)
        assert yielded == [], (key, member)
    assert flipped == 3 * 3  # every member (image, label, meta) of the three samples re-read
