"""noisebase against the source conformance suite (wdsprep.conformance): the small
synthetic sampleset in 200 KB shards; a sequence zip truncated; a color chunk zeroed in place; a color
chunk that inflates to 1.5 GiB (zlib, its .zarray says so); a sequence whose arrays declare 1 GiB of
frames it does not hold (zarr would read the absent chunks as zeros)."""
import json
import os
import zipfile
import zlib

import numpy as np
import zarr

from wdsprep.conformance import Hostile, SourceTests
from wdsprep.testing.edits import zeros, zip_with_member_replaced, zip_with_member_streamed

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

    def bomb_input(self, native):
        path = str(native / SEQUENCE)
        with zipfile.ZipFile(path) as archive:
            meta = json.loads(archive.read("color/.zarray"))
        meta["compressor"] = {"id": "zlib", "level": 9}
        zip_with_member_streamed(path, "color/.zarray", [json.dumps(meta).encode()])
        zip_with_member_streamed(path, "color/0.0.0.0.0", _zlib_stream(zeros(3 << 29)))
        return Hostile(path, 3 << 29)

    def malformed_input(self, native):
        path = str(native / SEQUENCE)
        with zipfile.ZipFile(path) as archive:
            metas = {name: json.loads(archive.read(name)) for name in archive.namelist() if name.endswith("/.zarray")}
        frame_bytes = sum(int(np.prod(meta["shape"][1:])) * np.dtype(meta["dtype"]).itemsize for meta in metas.values())
        frames = (1 << 30) // frame_bytes + 1  # every array declares this many frames; the chunks hold 4
        for name, meta in metas.items():
            meta["shape"][0] = frames
            zip_with_member_streamed(path, name, [json.dumps(meta).encode()])
        return Hostile(SEQUENCE, frames * frame_bytes)  # refused while planning, which names it as found

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


def _zlib_stream(chunks):
    """The zlib stream (numcodecs' Zlib codec) of the concatenated chunks, streamed."""
    compressor = zlib.compressobj(9)
    for chunk in chunks:
        yield compressor.compress(chunk)
    yield compressor.flush()
