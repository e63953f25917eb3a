"""Shards of every source made the user's way (`wdsprep synth`, then `wdsprep convert` in a
subprocess), and the independent reader `wdsprep.MapDataset` is judged against: Python's `tarfile`
over the manifest's shard list, members grouped by key."""
import json
import pathlib
import subprocess
import sys
import tarfile

from tests.timeouts import SUBPROCESS

# source -> (`wdsprep convert` options: several shards of several samples where the input allows, the split read)
SOURCES = {
    "generic": (("--shard-bytes", "100KB"), "train"),
    "voxels": (("--shard-bytes", "150KB"), "val"),
    "minecraft": (("--shard-bytes", "15KB"), "train"),
    "deepreg": (("--shard-bytes", "20KB"), "paired_h5_train"),
    "rawnind": (("--shard-bytes", "5MB"), "train"),
    "noisebase": (("--shard-bytes", "100KB"), "train"),
}


def _wdsprep(*argv) -> None:
    result = subprocess.run([sys.executable, "-m", "wdsprep", *map(str, argv), "--quiet"], capture_output=True,
                            text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr


def convert_source(source: str, root: pathlib.Path) -> tuple[pathlib.Path, str]:
    """(the shard directory, the split to read) of `source`'s synthetic input converted by the CLI."""
    native, out = root / "native", root / "shards"
    if source == "voxels":  # the voxels tests' tiny preset (the CLI's smallest takes 12 s to write)
        from tests.voxels.voxels_testdata import make_tiny

        make_tiny(native, seed=1)
    else:
        _wdsprep("synth", source, native)
    options, split = SOURCES[source]
    _wdsprep("convert", source, native, out, *options)
    return out, split


def tar_reference(out: pathlib.Path, split: str) -> list[dict]:
    """Every sample of `split` in manifest order, read with `tarfile` alone: the manifest's shard list
    in order, each shard's members grouped by key (the name up to its first dot; `__...__` members
    are the shard's index, not samples). A sample: `__key__`, `__shard__` (its file name), member -> bytes."""
    manifest = json.loads((out / "manifest.json").read_text())
    samples: list[dict] = []
    for row in manifest["splits"][split]["shards"]:
        start = len(samples)
        with tarfile.open(out / row["name"]) as archive:
            for member in archive.getmembers():
                if member.name.startswith("__"):
                    continue
                key, _, name = member.name.partition(".")
                if len(samples) == start or samples[-1]["__key__"] != key:
                    samples.append({"__key__": key, "__shard__": row["name"]})
                samples[-1][name] = archive.extractfile(member).read()
        assert len(samples) - start == row["samples"], row["name"]
    return samples


def same_raw(got: dict, expected: dict) -> None:
    """A MapDataset raw sample against a reference sample: key, shard, member names and bytes."""
    assert got["__key__"] == expected["__key__"]
    assert got["__url__"].endswith("/" + expected["__shard__"]), (got["__url__"], expected["__shard__"])
    members = {name: bytes(value) for name, value in got.items() if not name.startswith("__")}
    assert members == {name: value for name, value in expected.items() if not name.startswith("__")}, got["__key__"]


def flip_last_byte(path, key: str, member: str) -> None:
    """Flip the last data byte of member `key.member` of the shard at `path` (found by `tarfile`)."""
    with tarfile.open(path) as archive:
        info = archive.getmember(f"{key}.{member}")
    data = bytearray(path.read_bytes())
    data[info.offset_data + info.size - 1] ^= 0x01
    path.write_bytes(bytes(data))
