"""The heart of the issue: our shard loader against noisebase 1.1.1's own loader, batch for batch."""
from __future__ import annotations

import pytest
import torch

from .noisebase_testdata import ALL_BUFFERS, FRAMES, assert_same_batch, assert_same_batches, native, reference_loader, shards

pytest.importorskip("zarr")  # synthetic native data; tests comparing with noisebase skip without it

from wdsprep.sources.noisebase import TrainingSampleLoader  # noqa: E402

GRID = [
    # flip_rotate, stage, num_workers, samples, buffers, extra
    pytest.param(True, "train", 0, 4, ALL_BUFFERS, {}, id="flip-train-w0-s4-all"),
    pytest.param(False, "train", 0, 8, ALL_BUFFERS, {}, id="noflip-train-w0-s8-all"),
    pytest.param(True, "train", 2, 3, ["color", "motion", "depth"], {}, id="flip-train-w2-s3-subset"),
    pytest.param(True, "val", 0, 4, ALL_BUFFERS, {}, id="val-w0-s4-all"),
    pytest.param(True, "val", 2, 8, ["normal", "reference", "w_motion"], {}, id="val-w2-s8-subset"),
    pytest.param(True, "train", 0, 5, ["w_normal", "diffuse", "w_position"],
                 {"batch_size": 1, "drop_last": False, "val_split": 0.4}, id="flip-train-b1-nodrop"),
    pytest.param(True, "train", 0, 2, ["color"], {"shuffle": False, "seed": 7, "batch_size": 3, "val_split": 0.0},
                 id="noshuffle-seed7-b3"),
]


def _args(flip_rotate, stage, num_workers, samples, buffers, extra):
    args = dict(seed=42, val_split=0.2, shuffle=True, batch_size=2, drop_last=True, num_workers=num_workers,
                flip_rotate=flip_rotate, stage=stage, samples=samples, buffers=buffers)
    args.update(extra)
    return args


@pytest.mark.parametrize("flip_rotate, stage, num_workers, samples, buffers, extra", GRID)
def test_two_epochs_bit_identical_to_noisebase(tmp_path_factory, flip_rotate, stage, num_workers, samples, buffers, extra):
    args = _args(flip_rotate, stage, num_workers, samples, buffers, extra)
    theirs = reference_loader(native(tmp_path_factory), **args)
    ours = TrainingSampleLoader(shards(tmp_path_factory), **args)
    assert len(ours) == len(theirs)
    compared = 0
    for epoch in range(2):
        reference_batches, our_batches = list(theirs), list(ours)
        assert len(our_batches) == len(reference_batches) > 0
        for index, (mine, reference) in enumerate(zip(our_batches, reference_batches)):
            assert_same_batch(mine, reference, f"epoch {epoch} batch {index}")
            compared += 1
        assert ours.batch_sampler.epoch_idx == theirs.batch_sampler.epoch_idx == epoch + 1
    assert compared >= 8


def test_codec_none_and_one_frame_shards_match(tmp_path_factory):
    """Sequences spread over many shard parts (and uncompressed members) give the same batches."""
    args = _args(True, "train", 0, 4, ALL_BUFFERS, {})
    url = shards(tmp_path_factory, codec="none", shard_bytes="1KB")  # every frame in a shard of its own
    ours = TrainingSampleLoader(url + "/manifest.json", **args)
    theirs = reference_loader(native(tmp_path_factory), **args)
    assert_same_batches(ours, theirs)


def test_lockstep_batches_and_prev_camera(tmp_path_factory):
    loader = TrainingSampleLoader(shards(tmp_path_factory), batch_size=2, val_split=0.2, num_workers=0, samples=2,
                                  buffers=["motion"])
    batches = list(loader)
    assert [int(b["frame_index"]) for b in batches] == list(range(FRAMES)) * 2
    for group in (batches[:FRAMES], batches[FRAMES:]):
        assert all(b["file"] == group[0]["file"] for b in group)  # same sequences for all frames
        assert torch.equal(group[0]["prev_camera"]["crop_offset"], group[0]["crop_offset"])
        for prev, cur in zip(group, group[1:]):
            assert torch.equal(cur["prev_camera"]["crop_offset"], prev["crop_offset"])
            assert torch.equal(cur["prev_camera"]["view_proj_mat"], prev["view_proj_mat"])
    assert set(batches[0]["file"]).isdisjoint(batches[FRAMES]["file"])
    assert batches[0]["motion"].shape == (2, 2, 16, 16, 2) and not batches[0]["motion"].any()


def test_at_most_batch_sequences_open(tmp_path_factory):
    loader = TrainingSampleLoader(shards(tmp_path_factory), batch_size=2, val_split=0.2, num_workers=0, samples=1,
                                  buffers=["reference"])
    dataset = loader.dataset
    opened = []
    for _ in loader:
        opened.append(len(dataset._readers))
    assert max(opened) == 2



def test_close_stops_the_pool_and_the_dataset_reads_again(tmp_path_factory):
    args = _args(True, "train", 0, 2, ["color"], {})
    loader = TrainingSampleLoader(shards(tmp_path_factory), **args)
    dataset = loader.dataset
    first = list(loader)
    pool = dataset._pool
    assert pool is not None and dataset._readers  # batch_size 2: frames load on the pool
    dataset.close()
    assert dataset._pool is None and not dataset._readers
    assert pool._shutdown
    dataset.close()  # twice is harmless
    loader.batch_sampler.epoch_idx = 0  # the same epoch again, read through a fresh pool
    assert_same_batches(loader, first)
    assert dataset._pool is not None and dataset._pool is not pool
    dataset.close()

def test_resume_at_sequence_boundary_matches_uninterrupted_run(tmp_path_factory):
    args = _args(True, "train", 0, 4, ALL_BUFFERS, {"val_split": 0.0})  # 4 train sequences (n_val = batch_size), 2 groups
    url = shards(tmp_path_factory)
    full = TrainingSampleLoader(url, **args)
    first, second = list(full), list(full)

    interrupted = TrainingSampleLoader(url, **args)
    sampler = interrupted.batch_sampler
    assert not sampler.checkpoint(0, FRAMES + 1)  # mid-sequence: refused, like noisebase
    assert interrupted.state_dict() == {}
    taken = []
    for batch_idx, batch in enumerate(interrupted):
        if batch_idx == FRAMES:
            assert sampler.checkpoint(0, batch_idx)
            state = dict(interrupted.state_dict())
            sampler.cached_state = {}
            break
        taken.append(batch)
    assert state == {"start_epoch_idx": 0, "start_sequence_idx": 2}

    resumed = TrainingSampleLoader(url, **args)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(taken) == FRAMES and len(rest) == len(first) - FRAMES > 0
    assert_same_batches(taken + rest, first)
    assert_same_batches(resumed, second)  # the next epoch is whole again


def test_resume_state_matches_noisebase(tmp_path_factory):
    args = _args(True, "train", 0, 2, ["color"], {"val_split": 0.0})
    ours = TrainingSampleLoader(shards(tmp_path_factory), **args)
    theirs = reference_loader(native(tmp_path_factory), **args)
    for epoch, batch_idx in [(0, 0), (0, 3), (1, 4), (0, 8), (2, 5)]:
        assert ours.batch_sampler.checkpoint(epoch, batch_idx) == theirs.batch_sampler.checkpoint(epoch, batch_idx)
        assert ours.state_dict() == theirs.state_dict()
    state = {"start_epoch_idx": 0, "start_sequence_idx": 2}  # 4 train sequences: leaves the second group
    ours.load_state_dict(state)
    theirs.load_state_dict(state)
    assert assert_same_batches(ours, theirs) == FRAMES


def test_get_epoch_overrides_counting(tmp_path_factory):
    args = _args(True, "train", 0, 1, ["color"], {})
    ours = TrainingSampleLoader(shards(tmp_path_factory), get_epoch=lambda: 5, **args)
    theirs = reference_loader(native(tmp_path_factory), get_epoch=lambda: 5, **args)
    assert_same_batches(ours, theirs)


def test_bad_arguments(tmp_path_factory):
    from wdsprep.errors import ConfigError

    url = shards(tmp_path_factory)
    with pytest.raises(ConfigError, match="unknown buffer"):
        TrainingSampleLoader(url, buffers=["colour"])
    with pytest.raises(ConfigError, match="samples=64"):
        TrainingSampleLoader(url, samples=64)
    with pytest.raises(ConfigError, match="stage"):
        TrainingSampleLoader(url, stage="test")


def test_truncated_shard_names_the_shard(tmp_path_factory, tmp_path):
    import shutil

    from wdsprep.errors import ShardError

    source = shards(tmp_path_factory)
    target = tmp_path / "shards"
    shutil.copytree(source, target)
    victim = sorted(p for p in target.iterdir() if p.suffix == ".tar")[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    loader = TrainingSampleLoader(str(target), batch_size=2, val_split=0.0, num_workers=0, samples=2,
                                  buffers=ALL_BUFFERS, shuffle=False, stage="val")  # scenes 0 and 1
    with pytest.raises(ShardError, match=victim.name):
        for _ in loader:
            pass


def test_a_flipped_byte_in_any_member_is_a_shard_error_before_its_batch(tmp_path_factory, tmp_path):
    """Converted by the CLI without compression into several shards: one byte flipped in each member
    of each frame in turn (its last byte: past the samples the loader decompresses, so a partial read
    would never see it), the loader of the stage holding that frame raises a ShardError naming the
    shard at the batch that holds the frame, and every batch before is the intact shards' own."""
    from tests.core.shardsets import each_member_flipped, same_until_error
    from wdsprep.errors import ShardError
    from wdsprep.sources.noisebase.convert import frame_key
    from wdsprep.conformance import run_cli

    out = tmp_path / "out"
    status, _, err = run_cli("convert", "noisebase", native(tmp_path_factory), out, "--codec", "none",
                             "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    assert len(list(out.glob("*.tar"))) > 2
    args = dict(seed=42, val_split=0.2, batch_size=2, num_workers=0, samples=4, buffers=ALL_BUFFERS)
    expected, batch_of = {}, {}
    for stage in ("train", "val"):
        loader = TrainingSampleLoader(str(out), stage=stage, **args)
        for number, batch in enumerate(loader.batch_sampler):
            for index in batch:
                entry = loader.dataset.sequences[index["idx"] // FRAMES]
                batch_of[frame_key(entry["file"], index["idx"] % FRAMES)] = (stage, number)
        expected[stage] = list(TrainingSampleLoader(str(out), stage=stage, **args))
    cases = 0
    for path, key, member in each_member_flipped(out):
        cases += 1
        stage, number = batch_of[key]
        for other in ("train", "val"):
            count, error = same_until_error(TrainingSampleLoader(str(out), stage=other, **args), expected[other],
                                            assert_same_batch)
            if other != stage:
                assert error is None and count == len(expected[other]), (key, member, other)
                continue
            assert isinstance(error, ShardError) and path.name in str(error), (key, member, error)
            assert count == number, (key, member)  # the batches before the frame's, not its own
    assert cases == 6 * FRAMES * 7  # every member (6 arrays and meta.mp) of every frame
