"""Writes replace only what is ours: an output path that exists and is not a regular file (a FIFO, a
device node, a symlink to a file elsewhere) is refused with one line naming it, before any work, by
`wdsprep convert` (shards, manifest, units record, lock, temporaries), `reindex` and `upload` (to a
path and to file://), and left exactly as it was. Each command runs as a user runs it, in a child
process (an old writer opening a FIFO blocks: the child's time limit is the hang guard).
`show --out` is tested in tests/show/test_show_out.py.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.special_files import KIND_TEXT, NOT_OURS, make_special
from tests.timeouts import SUBPROCESS
from wdsprep.conformance import read_manifest

from .shardsets import make_older


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wdsprep", *map(str, args), "--quiet"], capture_output=True,
                          text=True, timeout=SUBPROCESS)


def assert_refused(done: subprocess.CompletedProcess, path: pathlib.Path, kind: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"wdsprep: error: {path}: exists and is {KIND_TEXT[kind]}, not a regular file"), done.stderr


def regular_files(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> pathlib.Path:
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("output_paths")
    SOURCE.synth(str(root / "native"), seed=1, samples=12, splits={"train": 12})
    return root / "native"


@pytest.fixture(scope="module")
def converted(native, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("converted") / "shards"
    done = run("convert", "generic", native, out)
    assert done.returncode == 0, done.stderr
    return out


CONVERT_CASES = [(name, kind) for kind in ("symlink", "fifo") for name in ("manifest.json", "_units.json",
                                            "train-00000-00.tar", "train-00000-00.tar.tmp", ".wdsprep.lock")]
CONVERT_CASES += [("manifest.json", "device"), ("train-00000-00.tar", "device")]


@pytest.mark.parametrize("name, kind", CONVERT_CASES)
def test_convert_refuses_an_output_name_that_is_not_a_regular_file(native, tmp_path, name, kind):
    out = tmp_path / "out"
    out.mkdir()
    unchanged = make_special(out / name, kind, tmp_path / "elsewhere")
    done = run("convert", "generic", native, out)
    assert_refused(done, out / name, kind)
    assert unchanged()
    assert regular_files(out) in ([], [".wdsprep.lock"])  # nothing written but the lock


def test_convert_refuses_before_it_reads_the_input(tmp_path):
    """The refusal comes first: the input, which does not even exist, is never planned."""
    out = tmp_path / "out"
    out.mkdir()
    unchanged = make_special(out / "train-00003-00.tar", "symlink", tmp_path / "elsewhere")
    done = run("convert", "generic", tmp_path / "no-such-input", out)
    assert_refused(done, out / "train-00003-00.tar", "symlink")
    assert unchanged()


def _older_copy(converted: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    older = tmp_path / "older"
    shutil.copytree(converted, older)
    make_older(older)
    return older


@pytest.mark.parametrize("name, kind", [
    ("train-00000-00.tar.tmp", "symlink"),  # the staged shard's temporary name: an older reindex wrote through it
    ("train-00000-00.tar.tmp", "fifo"),
    ("train-00000-00.tar.tmp", "device"),
    ("_units.json", "fifo"),
    ("manifest.json", "symlink"),
])
def test_reindex_refuses_an_output_name_that_is_not_a_regular_file(converted, tmp_path, name, kind):
    older = _older_copy(converted, tmp_path)
    # the manifest's link points at the manifest's own bytes elsewhere: readable, still not ours to replace
    content = (older / name).read_bytes() if name == "manifest.json" else NOT_OURS
    (older / name).unlink(missing_ok=True)
    unchanged = make_special(older / name, kind, tmp_path / "elsewhere", content)
    shards_before = {p.name: p.read_bytes() for p in older.glob("*.tar")}
    done = run("reindex", older)
    assert_refused(done, older / name, kind)
    assert unchanged()
    assert {p.name: p.read_bytes() for p in older.glob("*.tar")} == shards_before  # no shard replaced


@pytest.mark.parametrize("name, kind, scheme", [
    ("manifest.json", "fifo", ""),
    ("manifest.json", "device", ""),
    ("manifest.json", "symlink", "file://"),
    ("train-00000-00.tar", "symlink", ""),
    ("train-00000-00.tar", "fifo", "file://"),
    (".train-00000-00.tar.0badf00d.tmp", "symlink", ""),
])
def test_upload_refuses_a_destination_name_that_is_not_a_regular_file(converted, tmp_path, name, kind, scheme):
    destination = tmp_path / "dest"
    destination.mkdir()
    unchanged = make_special(destination / name, kind, tmp_path / "elsewhere")
    done = run("upload", converted, f"{scheme}{destination}")
    assert_refused(done, destination / name, kind)
    assert unchanged()
    assert regular_files(destination) == []  # nothing uploaded


def test_a_regular_file_in_the_way_is_still_replaced(native, converted, tmp_path):
    """The rule refuses only what is not a regular file: a stale manifest or shard is ours to replace."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "train-00000-00.tar").write_bytes(b"stale")
    assert run("convert", "generic", native, out).returncode == 0
    assert read_manifest(out)["splits"] == read_manifest(converted)["splits"]
    assert (out / "train-00000-00.tar").read_bytes() == (converted / "train-00000-00.tar").read_bytes()
