"""Truncated H5 and NIfTI files, an empty volume and a dangling link: one line naming the file, exit 1,
no output."""
import os

import h5py
import numpy as np
import pytest

from wdsprep.conformance import failing_convert

from .deepreg_testdata import write_nifti


def _nifti_input(root):
    rng = np.random.default_rng(0)
    for i in range(3):
        for role in ("moving_images", "fixed_images"):
            write_nifti(root / "train" / role / f"case{i}.nii.gz", rng.random((24, 24, 24)).astype(np.float32))
    return root / "train" / "moving_images" / "case1.nii.gz"


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


@pytest.mark.parametrize("defect, rule", [
    (_truncate, "cannot read NIfTI data: Compressed file ended before the end-of-stream marker"),
    (lambda path: open(path, "wb").close(), "not a readable NIfTI file: Empty file"),
    (lambda path: (os.remove(path), os.symlink(path.parent / "gone.nii.gz", path)), "not a readable NIfTI file"),
])
def test_a_bad_nifti_volume_is_one_line(tmp_path, defect, rule):
    path = _nifti_input(tmp_path / "d")
    defect(path)
    line = failing_convert(["deepreg", str(tmp_path / "d"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: {rule}"), line


def test_a_truncated_h5_file_is_one_line(tmp_path):
    for name in ("moving_images", "fixed_images"):
        (tmp_path / "d" / "train").mkdir(parents=True, exist_ok=True)
        with h5py.File(tmp_path / "d" / "train" / f"{name}.h5", "w") as handle:
            for case in range(3):
                handle[f"case{case}"] = np.ones((6, 6, 6), np.float32)
    path = tmp_path / "d" / "train" / "moving_images.h5"
    _truncate(path)
    line = failing_convert(["deepreg", str(tmp_path / "d"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: not a readable HDF5 file: "), line
