"""Nothing the input holds is lost, or made unreadable, while `wdsprep convert` says it succeeded
(generic source, through the CLI; each source's folder checks what its own layout may hold).

- a split folder whose name breaks the split-name rule is refused with one line naming it, before
  anything is written; a hidden folder is skipped with a line saying so;
- files the source does not take, stray files and nested folders are listed (a warning line and the
  manifest's `problems`); a split that yields no sample is reported, not left out without a word;
  nothing to convert at all is an error;
- option values are checked before any work (a missing input is not even looked at), and an output
  directory inside the input is refused.
The expected names come from the files each test plants, never from the code under test.
"""
import json
import os

import numpy as np
import pytest

import wdsprep
from wdsprep.conversion import convert
from wdsprep.errors import ConfigError
from wdsprep.conformance import read_manifest, run_cli, shard_bytes


def _samples(directory, count, start=0):
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        np.save(directory / f"k{i}.array.npy", np.arange(4, dtype=np.float32) + i)
        (directory / f"k{i}.meta.json").write_text(json.dumps({"i": i}))


def _convert(native, output, *extra):
    status, out, err = run_cli("convert", "generic", native, output, "--quiet", *extra)
    return status, err.strip().splitlines()


def _nothing_written(output):
    return not output.exists() or sorted(os.listdir(output)) in ([], [".wdsprep.lock"])


# ------------------------------------------------------------------------------- split names
@pytest.mark.parametrize("name", ["v1.0", "vålid", "tr ain", "-valid", "_valid", "valid.old"])
def test_a_split_folder_breaking_the_name_rule_is_one_line_naming_it_and_nothing_is_written(tmp_path, name):
    native, output = tmp_path / "in", tmp_path / "out"
    _samples(native / "train", 3)
    _samples(native / name, 2)
    status, lines = _convert(native, output)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"wdsprep: error: {native / name}: {name!r} is not a split name"), lines
    assert _nothing_written(output)


@pytest.mark.parametrize("name", ["valid-2", "Test_B", "0"])
def test_split_names_within_the_rule_convert_and_read_back(tmp_path, name):
    native, output = tmp_path / "in", tmp_path / "out"
    _samples(native / name, 3)
    assert _convert(native, output) == (0, [])
    keys = sorted(sample["__key__"] for sample in wdsprep.dataset(str(output), name, shuffle_shards=False))
    assert keys == ["k0", "k1", "k2"]


def test_a_hidden_folder_is_skipped_with_a_line_saying_so(tmp_path):
    native, output = tmp_path / "in", tmp_path / "out"
    _samples(native / "train", 3)
    _samples(native / ".ipynb_checkpoints", 2)
    status, lines = _convert(native, output)
    assert status == 0
    assert lines == [f"wdsprep: warning: {native}: not converted (hidden): .ipynb_checkpoints/"]
    assert set(read_manifest(output)["splits"]) == {"train"}


# ------------------------------------------------------------------------- what is not taken
def test_files_the_source_does_not_take_and_an_empty_split_beside_a_full_one_are_reported(tmp_path):
    native, output, clean = tmp_path / "in", tmp_path / "out", tmp_path / "clean"
    _samples(native / "train", 4)
    _samples(tmp_path / "only-train" / "train", 4)
    (native / "valid").mkdir()
    for name in ("a.png", "b.npz", "c.NPY"):
        (native / "valid" / name).write_bytes(b"x")
    (native / "train" / "k9.array.png").write_bytes(b"x")
    (native / "train" / "extra").mkdir()
    _samples(native / "train" / "extra", 1)
    (native / "README.txt").write_text("notes")
    status, lines = _convert(native, output)
    assert status == 0
    assert lines[0] == "wdsprep: warning: 5 input items not converted (listed in the manifest's 'problems'):"
    assert sorted(lines[1:]) == sorted([
        f"  {native}: not converted (a file beside the split folders): README.txt",
        f"  {native / 'train'}: not converted (a folder inside a split: only its own files are read): extra/",
        f"  {native / 'train'}: not converted (not <key>.<field>.npy|json): k9.array.png",
        f"  {native / 'valid'}: not converted (not <key>.<field>.npy|json): a.png, b.npz, c.NPY",
        f"  {native / 'valid'}: split 'valid' has no sample to convert; it is left out of the manifest",
    ])
    manifest = read_manifest(output)
    assert set(manifest["splits"]) == {"train"} and len(manifest["problems"]) == 5
    assert all(problem["item"].startswith(str(native)) for problem in manifest["problems"])
    assert _convert(tmp_path / "only-train", clean) == (0, [])
    assert shard_bytes(output) == shard_bytes(clean)  # the rest converted as if the strays were not there


def test_an_input_with_nothing_to_convert_is_one_line_and_no_manifest(tmp_path):
    native, output = tmp_path / "in", tmp_path / "out"
    (native / "train").mkdir(parents=True)
    for name in ("a.png", "b.npz", "c.NPY"):
        (native / "train" / name).write_bytes(b"x")
    status, lines = _convert(native, output)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"wdsprep: error: {native}: nothing to convert (") and "a.png, b.npz, c.NPY" in lines[0]
    assert _nothing_written(output)


def test_a_split_whose_every_item_is_skipped_is_reported_and_all_skipped_is_an_error(tmp_path):
    native, output = tmp_path / "in", tmp_path / "out"
    _samples(native / "train", 3)
    _samples(native / "valid", 2)
    for path in (native / "valid").glob("*.array.npy"):
        path.write_bytes(b"junk")
    status, lines = _convert(native, output, "--on-error", "skip")
    assert status == 0, lines
    manifest = read_manifest(output)
    assert set(manifest["splits"]) == {"train"}
    assert {"item": str(native / "valid"), "message": "split 'valid': every item was skipped; it is left out of the manifest"} in manifest["problems"]
    assert any("split 'valid': every item was skipped" in line for line in lines)
    for path in (native / "train").glob("*.array.npy"):
        path.write_bytes(b"junk")
    status, lines = _convert(native, tmp_path / "out2", "--on-error", "skip")
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"wdsprep: error: {native}: nothing converted, every item was skipped (")
    assert not (tmp_path / "out2" / "manifest.json").exists()


# --------------------------------------------------------------------------------- options
@pytest.mark.parametrize("source, options, message", [
    ("generic", ["--zstd-level", "99"], "--zstd-level must be from -131072 to 22"),
    ("generic", ["--zstd-level", "23"], "--zstd-level must be from -131072 to 22"),
    ("generic", ["--shard-bytes", "0"], "--shard-bytes must be a positive size"),
    ("generic", ["--shard-bytes", "0.4"], "--shard-bytes must be a positive size"),
    ("generic", ["--shard-bytes", "12 parsecs"], "--shard-bytes: cannot read size"),
    ("generic", ["--workers", "0"], "--workers must be at least 1"),
    ("generic", ["--split", "v1.0"], "--split: 'v1.0' is not a split name"),
    ("minecraft", ["--window-frames", "8", "--window-overlap", "8"], "window_overlap (8) must be smaller than window_frames (8)"),
    ("rawnind", ["--tile-size", "30"], "--tile-size 30 must be a multiple of 4"),
    ("noisebase", ["--rendering-height", "0"], "--rendering-height must be a positive number of pixels"),
    ("voxels", ["--levels", "one"], "--levels must be integers"),
])
def test_an_option_value_is_checked_before_any_work(tmp_path, source, options, message):
    """A value an option cannot take is a bad argument of the command line: one line, exit status 2."""
    output = tmp_path / "out"
    status, out, err = run_cli("convert", source, tmp_path / "missing-input", output, "--quiet", *options)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"wdsprep: error: wdsprep convert: {message}"), lines
    assert not output.exists(), "the output was touched before the options were checked"


def test_the_python_api_checks_options_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="--zstd-level must be from"):
        convert("generic", str(tmp_path / "missing"), str(tmp_path / "out"), zstd_level=99)
    with pytest.raises(ConfigError, match="--shard-bytes must be a positive size"):
        convert("generic", str(tmp_path / "missing"), str(tmp_path / "out"), shard_bytes=0)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------- output inside the input
@pytest.mark.parametrize("where", ["inside", "same", "through a link"])
def test_an_output_directory_inside_the_input_is_refused(tmp_path, where):
    native = tmp_path / "in"
    _samples(native / "train", 3)
    os.symlink(native, tmp_path / "link")
    output = {"inside": native / "shards", "same": native, "through a link": tmp_path / "link" / "shards"}[where]
    before = sorted(os.listdir(native))
    status, lines = _convert(native, output)
    assert status == 2 and len(lines) == 1, lines  # two arguments wdsprep cannot take together
    assert lines[0].startswith(f"wdsprep: error: wdsprep convert: {output}: the output directory lies inside the input {native}")
    assert sorted(os.listdir(native)) == before  # not even an empty output folder


def test_an_output_beside_the_input_with_a_common_prefix_is_fine(tmp_path):
    native = tmp_path / "in"
    _samples(native / "train", 3)
    assert _convert(native, tmp_path / "in-shards") == (0, [])
