"""noisebase against the source conformance suite (wdsprep.testing.conformance): the small
synthetic sampleset in 200 KB shards; a sequence zip truncated; a color chunk zeroed in place."""
import os

import numpy as np
import zarr

from wdsprep.testing.conformance import SourceTests
from wdsprep.testing.edits import zip_with_member_replaced

SEQUENCE = "sampleset_v1/train/scene0001.zip"


class TestNoisebaseConformance(SourceTests):
    source = "noisebase"
    convert_args = ("--shard-bytes", "200KB")
    rebalance_shard_bytes = 200_000
    synth_seed, synth_size = 3, "small"

    def stray_entries(self, native):
        return ("sampleset_v1/train/scene0009.zip.part", "sampleset_v1/train/notes.txt", "sampleset_v1/train/old/")

    def corrupt_input(self, native):
        path = str(native / SEQUENCE)
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)
        return path

    def edit_input(self, native):
        path = str(native / SEQUENCE)
        with zarr.storage.ZipStore(path, mode="r") as store:
            color = zarr.open_group(store, mode="r")["color"]
            encoded = color.compressor.encode(np.zeros(color.chunks, color.dtype))  # blosc makes it small
        return native / SEQUENCE, zip_with_member_replaced(path, "color/0.0.0.0.0", encoded)

    def stream(self, manifest, split, seed, epoch):
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_buffer=4).compose(
            wdsprep.noisebase.frames(buffers=["color", "depth"], samples=2, seed=seed, epoch=epoch))
