"""An empty ray file and a dangling link to one: one line naming the file and the rule, exit 1, no
output. (A corrupt deflate stream, and --on-error skip, are in the conformance suite.)"""
import os
import re

import pytest

from wdsprep.conformance import failing_convert

from .voxels_testdata import make_tiny


@pytest.mark.parametrize("defect, rule", [
    (lambda path: open(path, "wb").close(), r"not a readable .npz file \(empty file, 0 bytes\)"),
    (lambda path: (os.remove(path), os.symlink(path.parent / "gone.npz", path)), "dangling symbolic link"),
])
def test_a_bad_ray_file_is_one_line(tmp_path, defect, rule):
    native = make_tiny(tmp_path / "native", seed=1)
    path = native / "ray_dataset_hierarchical" / "level_0" / "00" / "0003_rays.npz"
    defect(path)
    line = failing_convert(["voxels", str(native), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: ") and re.search(rule, line), line


def test_an_object_given_two_splits_in_splits_json_is_one_line(tmp_path):
    """json keeps the last of two equal keys silently: an object listed in two splits would land in
    whichever came last without a word."""
    import json

    native = make_tiny(tmp_path / "native", seed=1)
    path = native / "dataset" / "splits.json"
    text = path.read_text()
    object_id, split = next(iter(json.loads(text)["object_splits"].items()))
    entry = f'"{object_id}": "{split}"'
    other = "val" if split != "val" else "train"
    assert text.index('"object_splits"') < text.index(entry) < text.index('"hash_object_usage"')
    path.write_text(text.replace(entry, f'"{object_id}": "{other}", {entry}', 1))
    line = failing_convert(["voxels", str(native), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == f"wdsprep: error: {path}: splits file is not valid JSON (duplicate key '{object_id}' in one object)", line
