"""A dangling link to a sequence zip: one line naming the file, exit 1, no output. (A truncated
zip, and --on-error skip, are in the conformance suite.)"""
import os
import shutil

from wdsprep.testing.edits import failing_convert

from .noisebase_testdata import native


def test_a_dangling_link_to_a_sequence_is_one_line(tmp_path_factory, tmp_path):
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    path = str(root / "sampleset_v1" / "train" / "scene0002.zip")
    os.remove(path)
    os.symlink(path + ".gone", path)
    line = failing_convert(["noisebase", str(root), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: not a readable zip file"), line
