"""`wdsprep.Loader`'s ring of shared-memory slabs (stream/slabs.py), from the user's side.

Each worker writes its batches' arrays into a few reused slabs; the main process views them as
tensors. What is checked, on shards made by `wdsprep convert` whose sample i holds the value i
(an independent reference: the key says what every element must be): the descriptors cross once
per slab, not once per batch (counted where the main process receives them); a batch the user
keeps is never overwritten, however far the loop goes past the ring; nothing is left in /dev/shm
when a worker is killed; namedtuples and tuples from a user's collate and epochs give what the
main process reads by itself; `persistent_workers` keeps the same workers (and their slabs) for
every pass, with the batches and the resume of fresh ones; torch's `default_collate` stacks straight
into the slab and gives torch's own batch.
"""
import collections
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from multiprocessing import resource_sharer
from torch.utils.data import default_collate, default_convert

import wdsprep
from wdsprep.stream.slabs import SHARED_BYTES, SlabRing

from ..timeouts import SUBPROCESS
from .valueshards import convert_value_shards


SAMPLES = 96
BATCH = 4
ELEMENTS = 1024  # float32: 4 KiB a sample


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return convert_value_shards(tmp_path_factory.mktemp("slabs"), SAMPLES, ELEMENTS, "100KB")


def _loader(manifest, workers, **options):
    dataset = wdsprep.dataset(manifest, "train", seed=3, shuffle_buffer=5, equalize=None)
    return wdsprep.Loader(dataset.compose(wdsprep.decode(strip=True)), batch_size=BATCH, num_workers=workers,
                          timeout=120 if workers else 0, **options)


def _intact(batch) -> bool:
    """Every element of every sample's array is the number in its key."""
    expected = torch.tensor([float(key[1:]) for key in batch["__key__"]])[:, None].expand(-1, ELEMENTS)
    return torch.equal(batch["array"], expected)


@pytest.fixture
def received(monkeypatch):
    """Counts, in the main process: slab descriptors detached (`fds`) and batches read from a slab (`slabs`)."""
    counts = collections.Counter()
    detach, read = resource_sharer.DupFd.detach, SlabRing.read

    def counting_detach(self):
        counts["fds"] += 1
        return detach(self)

    def counting_read(self, payload, slab):
        counts["slabs"] += 1
        return read(self, payload, slab)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counting_detach)
    monkeypatch.setattr(SlabRing, "read", counting_read)
    return counts


@pytest.mark.parametrize("workers", [1, 2])
def test_each_slab_crosses_once_and_every_batch_comes_through_one(manifest, workers, received):
    batches = 0
    for batch in _loader(manifest, workers):  # 4 slabs a worker: 2 batches in flight, the loop's, the one before
        assert _intact(batch)
        batches += 1
    assert batches == SAMPLES // BATCH
    assert received["slabs"] == batches  # the loop drops each batch: a slab is always free again
    assert received["fds"] <= 4 * workers  # a descriptor per slab made, none per batch


def test_a_kept_batch_is_never_overwritten(manifest, received):
    loader = _loader(manifest, 1, slabs=2)
    kept, seen = [], 0
    for batch in loader:
        seen += 1
        if seen in (1, 2, 7):  # two of them fill the ring: the worker must send others the ordinary way
            kept.append(batch)
        assert _intact(batch)
    assert seen == SAMPLES // BATCH
    assert all(_intact(batch) for batch in kept)
    assert 0 < received["slabs"] < seen  # some through slabs, the ones while the ring was full without


def test_a_view_kept_past_its_batch_keeps_the_slab(manifest):
    views = []
    for batch in _loader(manifest, 1, slabs=2):
        views.append((list(batch["__key__"]), batch["array"][:, :2].numpy()))  # a numpy view of a slice
    for keys, view in views:
        assert (view == np.array([float(key[1:]) for key in keys])[:, None]).all()


Pair = collections.namedtuple("Pair", "keys arrays")


def as_pair(samples):
    return Pair([s["__key__"] for s in samples], (default_collate([s["array"] for s in samples]), 7))


def test_namedtuples_and_tuples_from_a_user_collate(manifest):
    alone = list(_loader(manifest, 0, collate_fn=as_pair))
    with_workers = list(_loader(manifest, 2, collate_fn=as_pair))
    assert sorted(k for pair in alone for k in pair.keys) == sorted(k for pair in with_workers for k in pair.keys)
    for pair in with_workers:
        assert isinstance(pair, Pair) and pair.arrays[1] == 7
        assert _intact({"__key__": pair.keys, "array": pair.arrays[0]})


def test_persistent_workers_and_epochs(manifest):
    loader = _loader(manifest, 2, persistent_workers=True)
    for epoch in range(2):
        keys = []
        for batch in loader:
            assert _intact(batch)
            keys += batch["__key__"]
        assert sorted(keys) == [f"s{i:03d}" for i in range(SAMPLES)], epoch


def _epochs(loader, epochs: int) -> tuple[list[list[list[str]]], list[set[int]]]:
    """Per epoch: the keys of each batch in order, and the worker pids that made them."""
    keys, pids = [], []
    for _ in range(epochs):
        keys.append([]), pids.append(set())
        for batch in loader:
            assert _intact(batch)
            keys[-1].append(list(batch["__key__"]))
            pids[-1].add(int(batch["pid"]))
    return keys, pids


def test_persistent_workers_serve_every_epoch_as_fresh_ones_would(manifest, received):
    fresh_keys, fresh_pids = _epochs(_loader(manifest, 2, collate_fn=with_pid), 3)
    received.clear()
    kept_keys, kept_pids = _epochs(_loader(manifest, 2, collate_fn=with_pid, persistent_workers=True), 3)
    assert kept_keys == fresh_keys  # the same batches, epoch after epoch (the shuffle differs by epoch)
    assert fresh_keys[0] != fresh_keys[1]
    assert len(set().union(*fresh_pids)) == 6  # two new workers a pass ...
    assert kept_pids[0] == kept_pids[1] == kept_pids[2] and len(kept_pids[0]) == 2  # ... or the same two
    assert received["slabs"] == 3 * SAMPLES // BATCH
    assert received["fds"] <= 4 * 2  # the slabs outlive the pass with their workers: each crosses once


def test_persistent_workers_resume_exactly(manifest):
    whole, _ = _epochs(_loader(manifest, 2, collate_fn=with_pid), 2)
    whole = [keys for epoch in whole for keys in epoch]
    for stop in (1, SAMPLES // BATCH + 3):  # inside epoch 0, inside epoch 1
        loader = _loader(manifest, 2, collate_fn=with_pid, persistent_workers=True)
        taken = []
        while len(taken) < stop:
            for batch in loader:
                taken.append(list(batch["__key__"]))
                if len(taken) == stop:
                    state = loader.state_dict()
                    break
        resumed = _loader(manifest, 2, collate_fn=with_pid, persistent_workers=True)
        resumed.load_state_dict(state)
        rest = []
        while len(taken) + len(rest) < len(whole):
            rest += [list(batch["__key__"]) for batch in resumed]
        assert taken + rest == whole, stop


def _shm() -> set[str]:
    """What /dev/shm names, but the POSIX semaphores of other processes' multiprocessing locks (the
    ring makes none; a test suite beside this one may)."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def with_pid(samples):
    return {**default_collate(samples), "pid": os.getpid()}


def stacked_with_pid(samples):
    """`with_pid` without torch in the worker: the arrays stacked by numpy, so each batch's array
    crosses in a slab. (torch's `default_collate`, run in a worker, makes each batch's tensor in a
    named shared-memory segment and unlinks the name an instant later: a worker killed in that
    instant leaves torch's name behind, whatever the ring does.)"""
    return {"__key__": [sample["__key__"] for sample in samples],
            "array": np.stack([sample["array"] for sample in samples]), "pid": os.getpid()}


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_nothing_is_left_in_dev_shm_when_a_worker_is_killed(manifest, persistent):
    before = _shm()
    loader = _loader(manifest, 2, collate_fn=stacked_with_pid, slabs=3, persistent_workers=persistent)
    iterator = iter(loader)
    first = next(iterator)
    assert _intact(first)
    keys = list(first["__key__"])
    os.kill(first["pid"], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        for batch in iterator:
            assert _intact(batch)
            keys += batch["__key__"]
    del iterator, first
    assert not (_shm() - before)  # the slabs are anonymous memory: no name to leave behind
    for batch in loader:  # the next pass has live workers and goes on from the last batch delivered
        assert _intact(batch)
        keys += batch["__key__"]
    assert sorted(keys) == [f"s{i:03d}" for i in range(SAMPLES)]


def test_slabs_must_be_a_whole_number(manifest):
    with pytest.raises(wdsprep.errors.ConfigError, match="slabs=-1"):
        _loader(manifest, 1, slabs=-1)


def with_a_large_shared_tensor(samples):
    """A collate that makes one tensor in shared memory itself, as default_collate does in a worker."""
    big = torch.full((SHARED_BYTES // 4,), float(samples[0]["__key__"][1:]), dtype=torch.float32).share_memory_()
    return {**default_collate(samples), "big": big}


def test_a_large_tensor_already_in_shared_memory_crosses_by_its_descriptor(manifest, received):
    batches = 0
    for batch in _loader(manifest, 1, collate_fn=with_a_large_shared_tensor):
        assert _intact(batch) and torch.equal(batch["big"], torch.full_like(batch["big"], float(batch["__key__"][0][1:])))
        batches += 1
    assert received["slabs"] == batches  # the arrays through a slab ...
    assert received["fds"] >= batches  # ... the large shared tensor by its own descriptor, not copied


def rich(sample):
    """A sample of every kind torch's default_collate treats its own way, all derived from the key."""
    i = int(sample["__key__"][1:])
    return {"__key__": sample["__key__"], "array": sample["array"], "meta": sample["meta"],
            "nested": {"flags": np.arange(3) < i % 3, "small": torch.full((2, 2), i, dtype=torch.int16),
                       "ratio": i / 7, "count": i, "scalar": np.float64(i) / 3},
            "pair": (np.array([i, -i], dtype=np.int32), f"n{i}"), "name": sample["__key__"] * 2}


def _tree_equal(a, b) -> bool:
    """Equal in structure, types, dtypes and values (an independent walk: no code under test)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_tree_equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tree_equal(x, y) for x, y in zip(a, b))
    return a == b


def _rich_loader(manifest, workers, **options):
    dataset = wdsprep.dataset(manifest, "train", seed=3, shuffle_buffer=5, equalize=None)
    return wdsprep.Loader(dataset.compose(wdsprep.decode(strip=True)).map(rich), batch_size=BATCH,
                          num_workers=workers, timeout=120 if workers else 0, **{"collate_fn": default_collate, **options})


def as_list(samples):
    return samples


def _torchs(samples):
    """torch's own default_collate in this process over a batch's samples, then its default_convert (plain
    tuples become lists: what every batch of the Loader is, with or without workers)."""
    return default_convert(default_collate(samples))


def _by_first_key(batches) -> dict:
    return {batch["__key__"][0]: batch for batch in batches}


@pytest.fixture
def no_shared_segments_in_workers(monkeypatch):
    """Forked workers inherit this: a worker that makes a shared-memory segment (what torch's
    default_collate does for each stacked field in a worker) fails its batch."""
    pid = os.getpid()
    made = torch.TypedStorage._new_shared

    def refused(self, *args, **kwargs):
        if os.getpid() != pid:
            raise AssertionError("a worker made a shared-memory segment for its batch")
        return made(self, *args, **kwargs)

    monkeypatch.setattr(torch.TypedStorage, "_new_shared", refused)


def test_default_collate_stacks_straight_into_the_slab(manifest, received, no_shared_segments_in_workers):
    reference = [_torchs(batch) for batch in _rich_loader(manifest, 2, collate_fn=as_list)]
    expected, seen = _by_first_key(reference), []
    received.clear()
    for batch in _rich_loader(manifest, 2):  # each dropped before the next: a slab is always free
        seen.append(batch["__key__"][0])
        assert _tree_equal(batch, expected[seen[-1]]), seen[-1]
    assert sorted(seen) == sorted(expected) and len(seen) == SAMPLES // BATCH
    assert received["slabs"] == len(seen)


def test_default_collate_with_no_slab_free_is_torchs_own(manifest, received):
    reference = _by_first_key(_torchs(batch) for batch in _rich_loader(manifest, 1, collate_fn=as_list))
    received.clear()
    kept = list(_rich_loader(manifest, 1, slabs=2))  # every batch kept: the ring is full after two
    assert 0 < received["slabs"] < len(kept)
    assert _by_first_key(kept).keys() == reference.keys()
    for batch in kept:
        assert _tree_equal(batch, reference[batch["__key__"][0]])


def uneven(sample):
    i = int(sample["__key__"][1:])
    return {"__key__": sample["__key__"], "array": np.zeros(1 + i % 2, np.float32)}


def test_default_collate_refuses_uneven_fields_as_torch_does(manifest):
    dataset = wdsprep.dataset(manifest, "train", shuffle_shards=False, equalize=None)
    loader = wdsprep.Loader(dataset.compose(wdsprep.decode(strip=True)).map(uneven), batch_size=BATCH,
                            num_workers=1, timeout=120, collate_fn=default_collate)
    with pytest.raises(RuntimeError) as raised:
        next(iter(loader))
    with pytest.raises(RuntimeError) as torchs:
        default_collate([{"array": torch.zeros(1)}, {"array": torch.zeros(2)}])
    assert str(torchs.value) in str(raised.value)


def test_persistent_workers_free_the_slabs_of_a_pass_left_early(manifest, received):
    loader = _loader(manifest, 2, persistent_workers=True)
    keys = []
    for _ in range(4):  # each pass left after one batch, the next ones in flight (and discarded by torch)
        for batch in loader:
            assert _intact(batch)
            keys += batch["__key__"]
            break
    received.clear()
    batches = 0
    for batch in loader:  # the rest of the epoch: every batch through a slab again, none the ordinary way
        assert _intact(batch)
        keys += batch["__key__"]
        batches += 1
    assert sorted(keys) == [f"s{i:03d}" for i in range(SAMPLES)]  # each left pass went on where it stopped
    assert received["slabs"] == batches == SAMPLES // BATCH - 4



WORKER_IMPORTS = """
import sys
import torch, wdsprep
from torch.utils.data import default_collate

def with_modules(samples):
    return {**default_collate(samples), "modules": sorted(sys.modules)}

ds = wdsprep.dataset(sys.argv[1], "train", shuffle_shards=False, equalize=None).compose(wdsprep.decode(strip=True))
imported = set()
for batch in wdsprep.Loader(ds, batch_size=4, num_workers=2, collate_fn=with_modules, timeout=120):
    imported |= set(batch["modules"])
print(sorted(imported - set(sys.modules)))
"""


def test_forked_workers_import_nothing_the_main_process_lacks(manifest):
    """In a fresh process (as a user's: wdsprep and torch imported, nothing else), what a worker has
    imported by its batches that the main process has not: torch's worker loop seeds numpy's global
    generator, which imported numpy.random in each worker (~5 ms of CPU a worker)."""
    result = subprocess.run([sys.executable, "-c", WORKER_IMPORTS, manifest], capture_output=True, text=True,
                            timeout=SUBPROCESS, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
