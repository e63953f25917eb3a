"""A dangling link to a sequence zip: one line naming the file, exit 1, no output. (A truncated
zip, and --on-error skip, are in the conformance suite.)"""
import os
import shutil

from wdsprep.conformance import failing_convert

from .noisebase_testdata import native


def test_a_dangling_link_to_a_sequence_is_one_line(tmp_path_factory, tmp_path):
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    path = str(root / "sampleset_v1" / "train" / "scene0002.zip")
    os.remove(path)
    os.symlink(path + ".gone", path)
    line = failing_convert(["noisebase", str(root), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {path}: not a readable zip file"), line


def _rewrite_metadata(path, edit) -> None:
    """Rewrite every `.zarray` of the sequence zip at `path` through `edit(name, meta)`."""
    import json
    import zipfile

    from wdsprep.testing.edits import zip_with_member_streamed

    with zipfile.ZipFile(path) as archive:
        metas = {name: json.loads(archive.read(name)) for name in archive.namelist() if name.endswith("/.zarray")}
    for name, meta in metas.items():
        text = edit(name, meta)
        zip_with_member_streamed(path, name, [text.encode() if isinstance(text, str) else json.dumps(meta).encode()])


def test_frames_declared_but_not_held_are_refused(tmp_path_factory, tmp_path):
    """Every sequence's arrays declare twice the frames their chunks hold: zarr reads an absent chunk as
    its fill value, so the extra frames would convert as made-up data. Refused while planning."""
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    sequences = sorted((root / "sampleset_v1" / "train").glob("scene*.zip"))

    def double_frames(name, meta):
        meta["shape"][0] *= 2

    for path in sequences:
        _rewrite_metadata(str(path), double_frames)
    line = failing_convert(["noisebase", str(root), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith("wdsprep: error: sampleset_v1/train/scene0000.zip: ") and "the file holds" in line, line
    assert "an absent chunk would read as zeros" in line, line


def test_zarr_metadata_naming_a_key_twice_is_refused(tmp_path_factory, tmp_path):
    """zarr's parser keeps the last of two equal keys: a `.zarray` giving `dtype` twice would be read
    as whichever came last without a word."""
    root = tmp_path / "native"
    shutil.copytree(native(tmp_path_factory), root)
    path = str(root / "sampleset_v1" / "train" / "scene0002.zip")

    def dtype_twice(name, meta):
        import json

        text = json.dumps(meta)
        return text.replace('"dtype":', '"dtype": "<f8", "dtype":', 1) if name == "color/.zarray" else text

    _rewrite_metadata(path, dtype_twice)
    line = failing_convert(["noisebase", str(root), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == (f"wdsprep: error: {path}: member color/.zarray: zarr metadata is not valid JSON "
                    "(duplicate key 'dtype' in one object)"), line
