"""A truncated sequence zip and a dangling link to one: one line naming the file, exit 1, no output."""
import os
import shutil

import pytest
from .noisebase_testdata import native

from wdsprep.testing.edits import failing_convert


@pytest.mark.parametrize("defect, rule", [
    (lambda path: open(path, "r+b").truncate(os.path.getsize(path) // 2), "not a readable zip file"),
    (lambda path: (os.remove(path), os.symlink(path + ".gone", path)), "not a readable zip file"),
])
def test_a_bad_sequence_zip_is_one_line(tmp_path_factory, tmp_path, defect, rule):
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    path = str(root / "sampleset_v1" / "train" / "scene0002.zip")
    defect(path)
    line = failing_convert(["noisebase", str(root), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: {rule}"), line
