"""A ray file with a corrupt deflate stream, an empty one, a dangling link: one line naming the file,
exit 1, no output."""
import os
import zipfile

import pytest
from .voxels_testdata import make_tiny

from wdsprep.testing.edits import failing_convert


def _corrupt_member(path):
    with zipfile.ZipFile(path) as handle:
        info = handle.getinfo("distances.npy")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    data = bytearray(open(path, "rb").read())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for offset in range(8, 40):
        data[start + offset] ^= 0x5A
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("defect, rule", [
    (_corrupt_member, r"not a readable .npz file \(Error -3 while decompressing data"),
    (lambda path: open(path, "wb").close(), r"not a readable .npz file \(No data left in file\)"),
    (lambda path: (os.remove(path), os.symlink(path.parent / "gone.npz", path)), "dangling symbolic link"),
])
def test_a_bad_ray_file_is_one_line(tmp_path, defect, rule):
    import re

    native = make_tiny(tmp_path / "native", seed=1)
    path = native / "ray_dataset_hierarchical" / "level_0" / "00" / "0003_rays.npz"
    defect(path)
    line = failing_convert(["voxels", str(native), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: ") and re.search(rule, line), line
