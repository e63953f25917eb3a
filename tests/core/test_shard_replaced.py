"""Shards replaced under a reader: a local shard cut short, rewritten in place, or replaced by rename
while `wdsprep.dataset` / `wdsprep.Loader` read it (shards made by `wdsprep convert generic`).

A cut, or a rewrite in place (another conversion's shard of the same size copied over it, so that
only array values differ), is a `ShardError` naming the shard, in the process that reads, with
DataLoader workers too; every sample delivered before it is one of the input's samples, byte for
byte (checked against the `.npy` files the shards were converted from, not against anything the
reader made).
A shard replaced by rename is read to its end from the file that was opened.

Every case runs in a child process: a reader that maps shards is killed by SIGBUS when the file
shrinks under the mapping, which must show as a failed test, not as a crashed test session. The
child's reader is the public API; `patch` shrinks `stream/reading/read.py`'s buffers so that the paths
that read a sample again (a shuffle buffer larger than the bytes kept) meet the change too.
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.timeouts import SUBPROCESS
from wdsprep import cli
from wdsprep.shards.manifest import Manifest

CHILD = r"""
import hashlib, json, os, sys
import numpy as np
args = json.loads(sys.argv[1])
import wdsprep
import wdsprep.stream.reading.read as read
for name, value in args["patch"].items():
    setattr(read, name, value)

def act():
    shard = args["shard"]
    if args["action"] == "truncate":  # at a page boundary, as a copy growing in blocks leaves it
        os.truncate(shard, os.path.getsize(shard) // 3 // 4096 * 4096)
    elif args["action"] == "rewrite":  # `cp other shard`: in place, the same size and layout, other arrays
        with open(args["other"], "rb") as source, open(shard, "r+b") as handle:
            handle.write(source.read())
    elif args["action"] == "rename":
        with open(shard, "rb") as handle:
            data = handle.read()
        with open(shard + ".new", "wb") as handle:
            handle.write(bytes(b ^ 0x5A for b in data))
        os.replace(shard + ".new", shard)

dataset = wdsprep.dataset(args["manifest"], "train", seed=1, shuffle_buffer=args["buffer"], equalize=None)
dataset = dataset.compose(wdsprep.decode(strip=True))
if args["workers"]:
    source = wdsprep.Loader(dataset, batch_size=4, num_workers=args["workers"], collate_fn=list)
else:
    source = ([sample] for sample in dataset)
got, error, acted = [], None, False
try:
    for batch in source:
        got += [[s["__key__"], hashlib.sha256(np.asarray(s["array"]).tobytes()).hexdigest()] for s in batch]
        if not acted and len(got) >= args["after"]:
            act()
            acted = True
except Exception as exception:
    error = f"{type(exception).__name__}: {exception}"
print(json.dumps({"got": got, "error": error}))
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """200 samples of a 16 KiB float32 array and a dict, converted by the CLI into one shard; the
    expected content of each sample, from the input files."""
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("replaced")
    for seed, name in ((0, ""), (1, "-other")):  # the other: the same layout and sizes, other values
        SOURCE.synth(str(root / f"in{name}"), seed, "small")
        assert cli.main(["convert", "generic", str(root / f"in{name}"), str(root / f"out{name}"), "--codec", "none", "--quiet"]) == 0
    manifest = Manifest.loads((root / "out" / "manifest.json").read_bytes())
    (row,) = manifest.splits["train"]
    assert (root / "out-other" / row["name"]).stat().st_size == row["bytes"]
    expected = {}
    for name in os.listdir(root / "in" / "train"):
        if name.endswith(".array.npy"):
            array = np.load(root / "in" / "train" / name)
            expected[name.split(".")[0]] = hashlib.sha256(array.tobytes()).hexdigest()
    return root / "out", row["name"], expected


def _read(converted, tmp_path, *, action, buffer=0, workers=0, after=1, patch=None):
    """Copy the converted shards, read them in a child that does `action` to the shard after
    `after` samples; (samples as [key, sha256], error text or None, the shard's name)."""
    out, name, _ = converted
    here = tmp_path / "shards"
    here.mkdir()
    for file in os.listdir(out):
        (here / file).write_bytes((out / file).read_bytes())
    args = {"manifest": str(here / "manifest.json"), "shard": str(here / name), "action": action, "buffer": buffer,
            "workers": workers, "after": after, "patch": patch or {}, "other": str(out.parent / "out-other" / name)}
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                            timeout=SUBPROCESS)
    assert result.returncode == 0, f"the reader died (rc {result.returncode}):\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "Bus error" not in result.stderr and "shared memory" not in (report["error"] or "")
    return report["got"], report["error"], name


def _delivered_are_the_inputs(got, expected):
    keys = [key for key, _ in got]
    assert len(keys) == len(set(keys))
    for key, digest in got:
        assert expected[key] == digest, key


# the read paths of stream/reading/read.py that a change can meet: in order (one buffer reused; a sample
# larger than the window read straight into its own bytearrays as it is checked), and through a
# shuffle buffer (windows kept; a sample read and digested again when its window was dropped; a
# sample larger than the window read and digested only when it is taken)
PATHS = {
    "in order": dict(buffer=0),
    "in order, samples larger than a window": dict(buffer=0, patch={"WINDOW": 4096}),
    "shuffle buffer": dict(buffer=50),
    "shuffle buffer, windows dropped": dict(buffer=50, patch={"KEEP": 1 << 16}),
    "shuffle buffer, samples larger than a window": dict(buffer=50, patch={"WINDOW": 4096, "KEEP": 1 << 16}),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("action", ["truncate", "rewrite"])
def test_a_shard_cut_or_rewritten_while_it_is_read_is_a_shard_error_naming_it(converted, tmp_path, path, action):
    got, error, name = _read(converted, tmp_path, action=action, **PATHS[path])
    assert error is not None and error.startswith("ShardError") and name in error, error
    assert 1 <= len(got) < 200
    _delivered_are_the_inputs(got, converted[2])


def test_with_dataloader_workers_the_error_names_the_shard_not_shared_memory(converted, tmp_path):
    got, error, name = _read(converted, tmp_path, action="truncate", workers=2, after=4)
    # raised in the worker that met the cut (mid-read, or on opening the shard: its index is gone)
    assert error is not None and "ShardError" in error, error
    assert f"{name}: " in error and ("cut or rewritten while being read" in error or "__wdsprep_index__" in error), error
    _delivered_are_the_inputs(got, converted[2])


@pytest.mark.parametrize("buffer", [0, 50])
def test_a_shard_replaced_by_rename_is_read_to_its_end_from_the_file_opened(converted, tmp_path, buffer):
    got, error, _ = _read(converted, tmp_path, action="rename", buffer=buffer)
    assert error is None
    assert sorted(key for key, _ in got) == sorted(converted[2])
    _delivered_are_the_inputs(got, converted[2])
