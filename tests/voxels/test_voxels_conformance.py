"""voxels against the source conformance suite (wdsprep.conformance): the tiny synthetic
dataset in 150 KB shards; a ray file's deflate stream corrupted; its distances zeroed in place; its
distances member inflating to 1.5 GiB; its origins member declaring 3 GiB and holding 16 bytes."""
import io

import numpy as np

from wdsprep.conformance import Hostile, SourceTests
from wdsprep.testing.edits import corrupt_zip_member, zeros, zip_with_member_replaced, zip_with_member_streamed

from .voxels_testdata import make_tiny

RAY_FILE = "ray_dataset_hierarchical/level_0/00/0003_rays.npz"


class TestVoxelsConformance(SourceTests):
    source = "voxels"
    convert_args = ("--shard-bytes", "150KB")
    rebalance_shard_bytes = 150_000  # its units overrun their estimates at this size already

    def make_input(self, directory):
        return make_tiny(directory, seed=1)

    def plan_files(self, native):
        return ("dataset/splits.json", "dataset/metadata.json")

    def stray_entries(self, native):
        return ("ray_dataset_hierarchical/notes.txt", "ray_dataset_hierarchical/old/",
                "ray_dataset_hierarchical/level_0/00/0003_rays.npz.bak")

    def corrupt_input(self, native):
        corrupt_zip_member(str(native / RAY_FILE), "distances.npy")
        return str(native / RAY_FILE)

    def bomb_input(self, native):
        declared = 3 << 29  # 1.5 GiB of float32 distances, all there (zeros deflate ~1000:1)
        header = _npy_header("<f4", (declared // 4,))
        zip_with_member_streamed(str(native / RAY_FILE), "distances.npy", [header, *zeros(declared)])
        return Hostile(str(native / RAY_FILE), declared)

    def malformed_input(self, native):
        declared = (2**28, 3)  # 3 GiB of float32 origins declared, 16 bytes present
        zip_with_member_streamed(str(native / RAY_FILE), "origins.npy", [_npy_header("<f4", declared), bytes(16)])
        return Hostile(str(native / RAY_FILE), 2**28 * 3 * 4)

    def edit_input(self, native):
        path = native / RAY_FILE
        with np.load(path) as arrays:
            zeros = np.zeros_like(arrays["distances"])  # compresses better: the archive is padded back to its size
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, zeros, allow_pickle=False)
        return path, zip_with_member_replaced(str(path), "distances.npy", buffer.getvalue())

    def stream(self, manifest, split, seed, epoch):
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_buffer=8).compose(
            wdsprep.voxels.samples(mode="coo", rays_per_chunk=50))

    def sample_id(self, sample):
        return sample["hash"], sample["chunk_idx"], sample["origins"].numpy().tobytes()


def _npy_header(descr: str, shape: tuple) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()
