"""What `wdsprep inspect LOCATION` reads, decided by the location's suffix: a mix file (`.toml`), or
a dataset (its directory, or its manifest `.json`). A local file with another suffix is one line
saying what inspect reads, never a manifest error about `<file>/manifest.json`; a missing `.toml`
is a mix file that cannot be read. Shards made by `wdsprep convert`; the sample count the answers
name is counted with `tarfile`."""
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.conformance import run_cli

from .shardsets import converted_arrays

EXPECTED = "neither a dataset nor a mix file: inspect reads a dataset's directory or its manifest (.json), or a mix file (.toml)"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("inspect-location")
    converted_arrays(root, [f"s{i}" for i in range(5)], 64, seed=7)
    return root


def _samples(directory: pathlib.Path) -> int:
    keys = set()
    for path in directory.glob("*.tar"):
        with tarfile.open(path) as archive:
            keys |= {m.name.split(".", 1)[0] for m in archive.getmembers() if not m.name.startswith("__")}
    return len(keys)


def _mix_text(dataset: pathlib.Path) -> str:
    return f'[[part]]\nlocation = "{dataset / "out"}"\nweight = 1\n'


@pytest.mark.parametrize("name", ["mix.cfg", "mix", "manifest.txt"])
def test_a_file_with_another_suffix_is_one_line_saying_what_inspect_reads(dataset, tmp_path, name):
    """A mix file or a manifest under a name without its suffix: one line naming the file and what
    inspect expected (rc 1), in this process and from the command line (no traceback)."""
    path = tmp_path / name
    if name == "manifest.txt":
        shutil.copy(dataset / "out" / "manifest.json", path)
    else:
        path.write_text(_mix_text(dataset))
    status, out, err = run_cli("inspect", path)
    assert (status, out) == (1, "")
    assert err.splitlines() == [f"wdsprep: error: {path}: {EXPECTED}"]
    child = subprocess.run([sys.executable, "-m", "wdsprep", "inspect", str(path)], capture_output=True, text=True,
                           timeout=SUBPROCESS)
    assert (child.returncode, child.stdout, child.stderr) == (1, "", f"wdsprep: error: {path}: {EXPECTED}\n")
    status, _, err = run_cli("inspect", f"file://{path}")
    assert status == 1 and err.splitlines() == [f"wdsprep: error: file://{path}: {EXPECTED}"]


def test_a_missing_toml_is_a_mix_file_that_cannot_be_read(tmp_path):
    status, _, err = run_cli("inspect", tmp_path / "nosuch.toml")
    assert status == 1
    assert err.splitlines() == [f"wdsprep: error: {tmp_path / 'nosuch.toml'}: cannot read the mix file (No such file or directory)"]


def test_datasets_and_mix_files_are_read_as_before(dataset, tmp_path):
    """A dataset's directory, its manifest.json, a directory named like a mix file, and a mix file:
    each read for what it is (the sample count from tarfile)."""
    count = _samples(dataset / "out")
    for location in (dataset / "out", dataset / "out" / "manifest.json"):
        status, out, err = run_cli("inspect", location)
        assert status == 0, err
        assert f"{count:9d} samples" in out, out
    named_like_a_mix = tmp_path / "data.toml"
    shutil.copytree(dataset / "out", named_like_a_mix)
    status, out, err = run_cli("inspect", named_like_a_mix)
    assert status == 0 and f"{count:9d} samples" in out, err
    mix_file = tmp_path / "mix.toml"
    mix_file.write_text(_mix_text(dataset))
    status, out, err = run_cli("inspect", mix_file)
    assert status == 0, err
    assert f"epoch 0: {count} samples" in out, out
