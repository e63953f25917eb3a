"""A wdsprep error raised in another process reaches the user as itself: its class, its one line and
its attributes. Loader workers, a plain torch DataLoader over `MapDataset`, a process pool.

Before: a corrupt shard read by `wdsprep.Loader(num_workers>0)` (or a user's own DataLoader with
workers) was a `RuntimeError` holding the worker's whole traceback (`except wdsprep.ShardError`
missed it), and a `ShardError` could not be unpickled (`__init__() missing 1 required positional
argument`), so a process pool handed back a broken pool instead."""
import concurrent.futures
import inspect
import multiprocessing
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

import wdsprep
import wdsprep.errors
from wdsprep.errors import ShardError

from .mapsources import convert_source, flip_last_byte, tar_reference

EXAMPLES = {  # class -> the arguments it is raised with
    "UnitFailedError": (ValueError("bad unit"), 3, "Traceback ..."),
    "ShardError": ("s3://bucket/train-00001.tar", "member k.x.npy: corrupt"),
    "DownloadError": ("https://host/file.ARW: HTTP 503",),
}
KEYWORDS = {"DownloadError": {"transient": True}}


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    """Generic shards with one flipped byte in sample 3's `meta.mp`: (shards, a good copy, the line a
    reader must raise, the shard's path, the sample's position)."""
    out, split = convert_source("generic", tmp_path_factory.mktemp("generic"))
    reference = tar_reference(out, split)
    bad = tmp_path_factory.mktemp("corrupt") / "shards"
    shutil.copytree(out, bad)
    shard, key = bad / reference[3]["__shard__"], reference[3]["__key__"]
    flip_last_byte(shard, key, "meta.mp")
    return bad, out, f"{shard}: member {key}.meta.mp: corrupt", str(shard), 3


@pytest.mark.parametrize("name", sorted(name for name, value in vars(wdsprep.errors).items()
                                        if inspect.isclass(value) and value.__module__ == "wdsprep.errors"))
def test_every_error_pickles_as_it_is(name):
    cls = getattr(wdsprep.errors, name)
    error = cls(*EXAMPLES.get(name, ("some input: the rule it breaks",)), **KEYWORDS.get(name, {}))
    error.__notes__ = ["a note"]
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls and str(again) == str(error) and again.args == error.args
    assert vars(again).keys() == vars(error).keys()
    for attribute, value in vars(error).items():
        assert str(getattr(again, attribute)) == str(value), attribute


def test_a_shard_error_of_one_text_is_its_url_and_reason():
    """`ShardError(text)` (how torch raises a worker's error again): "URL: reason" is split at the first
    ": "; a text of several lines is the reason alone."""
    error = ShardError("http://host:8080/a.tar: member k.x: corrupt")
    assert (error.url, error.reason, str(error)) == ("http://host:8080/a.tar", "member k.x: corrupt",
                                                     "http://host:8080/a.tar: member k.x: corrupt")
    error = ShardError("Caught ShardError in DataLoader worker process 0.\nOriginal Traceback: ...")
    assert error.url == "" and str(error) == error.reason == "Caught ShardError in DataLoader worker process 0.\nOriginal Traceback: ..."


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_loader_raises_a_workers_shard_error_as_its_one_line(corrupt, workers):
    bad, _, line, shard, _ = corrupt
    with pytest.raises(ShardError) as raised:
        for _ in wdsprep.Loader(wdsprep.dataset(bad, "train", seed=0), batch_size=4, num_workers=workers):
            pass
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value)
    assert raised.value.url == shard and raised.value.reason.startswith(line[len(shard) + 2:])


def test_a_plain_dataloader_over_mapdataset_raises_a_shard_error(corrupt):
    """The user's own DataLoader with workers: torch raises the worker's error again by its class, so
    `except wdsprep.ShardError` catches it (torch's text: the worker's traceback, ending in the line)."""
    bad, _, line, _, _ = corrupt
    loader = torch.utils.data.DataLoader(wdsprep.MapDataset(bad, "train", decode=False), batch_size=2,
                                         num_workers=1, collate_fn=lambda batch: batch)
    with pytest.raises(ShardError, match="Caught ShardError in DataLoader worker process 0") as raised:
        for _ in loader:
            pass
    assert line in str(raised.value)


def _read(bad, position):
    return wdsprep.MapDataset(bad, "train", decode=False)[position]


def test_a_process_pool_hands_back_the_shard_error(corrupt):
    bad, _, line, shard, position = corrupt
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        with pytest.raises(ShardError) as raised:
            pool.submit(_read, bad, position).result()
        assert pool.submit(_read, bad, position - 1).result()["__key__"]  # the pool still works
    assert raised.value.url == shard and str(raised.value).startswith(line)


SCRIPT = """
import gc, multiprocessing, sys
import wdsprep
gc.disable()  # what is freed is freed by its last reference, not by a collection that may come later
bad, good = sys.argv[1:]
try:
    for _ in wdsprep.Loader(wdsprep.dataset(bad, "train", seed=0), batch_size=4, num_workers=2):
        pass
except wdsprep.ShardError as error:
    print("caught", error)
print("workers left", len(multiprocessing.active_children()))
for _ in wdsprep.Loader(wdsprep.dataset(good, "train", seed=0), batch_size=4, num_workers=2):
    pass
print("done")
"""


def test_a_failed_loader_shuts_its_workers_down_at_once(corrupt):
    """After a worker's error, the failed pass's workers are gone when the error is handled, and the next
    Loader's forked workers inherit nothing of it (the original error's traceback held torch's iterator
    in a cycle: its workers lived on until a collection, which a forked worker could run, printing
    "Exception ignored ... can only test a child process")."""
    bad, good, line, _, _ = corrupt
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(bad), str(good)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[0].startswith(f"caught {line}")
    assert run.stdout.splitlines()[1:] == ["workers left 0", "done"]
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
