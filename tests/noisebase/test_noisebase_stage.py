"""`wds.WebDataset(urls).compose(wdsprep.noisebase.frames(...))` gives the loader's frames."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import webdataset as wds

import wdsprep
from wdsprep.sources.noisebase import TrainingSampleLoader, frames

from .noisebase_testdata import ALL_BUFFERS, FRAMES, SEQUENCES, shards


def _flatten(frame: dict, prefix=""):
    for key, value in frame.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        elif isinstance(value, np.ndarray):
            yield prefix + key, value


def test_stage_on_raw_samples_matches_loader_frames(tmp_path_factory):
    url = shards(tmp_path_factory)
    pipeline = wds.WebDataset(wdsprep.urls(url, "train"), shardshuffle=False).compose(
        frames(buffers=ALL_BUFFERS, samples=3))
    produced = {(f["file"], f["frame_index"]): f for f in pipeline}
    assert len(produced) == SEQUENCES * FRAMES
    # validation stage: no flips, so both use the identity orientation
    loader = TrainingSampleLoader(url, stage="val", val_split=0.5, batch_size=2, drop_last=False, num_workers=0, samples=3,
                                  buffers=ALL_BUFFERS)
    checked = 0
    for batch in loader:
        for slot, file in enumerate(batch["file"]):
            frame = produced[(file, int(batch["frame_index"]))]
            for key, value in _flatten(frame):
                node = batch
                for part in key.split("."):
                    node = node[part]
                assert torch.equal(node[slot], torch.as_tensor(value)), key
            checked += 1
    assert checked == 3 * FRAMES


def test_stage_flip_rotate_is_deterministic_per_epoch(tmp_path_factory):
    urls = wdsprep.urls(shards(tmp_path_factory), "train")

    def offsets(epoch):
        stage = frames(buffers=["color"], samples=1, flip_rotate=True, seed=1, epoch=epoch)
        return [tuple(f["crop_offset"]) for f in wds.WebDataset(urls, shardshuffle=False).compose(stage)]

    assert offsets(0) == offsets(0)
    assert offsets(0) != offsets(1)


def test_stage_refuses_foreign_samples():
    from wdsprep.errors import FormatError
    from wdsprep.shards.codec import Encoder

    raw = {"__key__": "x", **dict(Encoder().encode_fields("x", {"meta": {"a": 1}}))}
    with pytest.raises(FormatError, match="not a noisebase frame"):
        list(frames()([raw]))
