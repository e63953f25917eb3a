"""How `wdsprep.Loader`'s batches cross from DataLoader workers to the main process, by torch's
transfer (`slabs=0`, or `pin_memory=True`; the Loader's ring of slabs: test_loader_slabs.py), and
by either way the same batches as without workers.

A tensor a worker sends goes through shared memory, and the main process rebuilds it from a file
descriptor handed over a socket (`multiprocessing.resource_sharer.DupFd.detach`, called by torch's
`rebuild_storage_fd`): one connection per tensor. The
Loader sends a batch's small top-level numpy fields (`__index__`, `__epoch__`, labels) pickled
inside the batch's message instead and converts them in the main process; large fields still go
through shared memory, and with `pin_memory` every field is a tensor in the worker (the pinning
thread pins tensors). Counted here in the main process, on shards made by `wdsprep convert`; what
the user gets is checked against the same loader without workers, where nothing crosses.
"""
import contextlib
import json

import pytest
import torch
from multiprocessing import resource_sharer

import wdsprep

from .valueshards import convert_value_shards

SAMPLES = 48
BATCH = 8
ELEMENTS = 4096  # float32: 16 KiB a sample, 128 KiB a batch (above the inline bound)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return convert_value_shards(tmp_path_factory.mktemp("transfer"), SAMPLES, ELEMENTS, "200KB")


def _batches(manifest, workers, **options):
    dataset = wdsprep.dataset(manifest, "train", seed=3, shuffle_buffer=4, equalize=None)
    dataset = dataset.compose(wdsprep.decode(strip=True, bookkeeping=True))
    return list(wdsprep.Loader(dataset, batch_size=BATCH, num_workers=workers,
                               timeout=120 if workers else 0, **options))


def _by_key(batches):
    """key -> every field's value for that sample, with its type and dtype (but `__piece_start__`:
    where the piece its worker reads starts, which depends on the number of workers)"""
    rows = {}
    for batch in batches:
        for row, key in enumerate(batch["__key__"]):
            fields = {}
            for name, value in batch.items():
                if name == "__piece_start__":
                    assert isinstance(value, torch.Tensor) and value.dtype == torch.int64
                    continue
                item = value[row]
                if isinstance(value, torch.Tensor):
                    fields[name] = ("tensor", str(value.dtype), item.tolist())
                else:
                    fields[name] = (type(value).__name__, json.dumps(item, sort_keys=True))
            rows[key] = fields
    return rows


@pytest.fixture
def rebuilt(monkeypatch):
    """How many storages the main process rebuilt from a worker's file descriptor."""
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    calls = []
    original = resource_sharer.DupFd.detach

    def counting(self):
        calls.append(1)
        return original(self)

    # a method of the class: workers pickle DupFd instances by class name, only the main process detaches
    monkeypatch.setattr(resource_sharer.DupFd, "detach", counting)
    return calls


@pytest.mark.parametrize("slabs", [None, 0], ids=["ring", "torch"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_workers_deliver_what_the_main_process_reads_itself(manifest, workers, slabs):
    alone, with_workers = _by_key(_batches(manifest, 0)), _by_key(_batches(manifest, workers, slabs=slabs))
    assert len(alone) == SAMPLES
    assert with_workers == alone
    first = _batches(manifest, workers, slabs=slabs)[0]
    assert {name for name, value in first.items() if isinstance(value, torch.Tensor)} == {
        "array", "__index__", "__epoch__", "__piece_start__"}


def test_small_fields_cross_inside_the_batch_message(manifest, rebuilt):
    batches = _batches(manifest, 2, slabs=0)  # torch's transfer (the ring's own: test_loader_slabs.py)
    assert len(batches) == SAMPLES // BATCH
    assert all(isinstance(batch["__index__"], torch.Tensor) for batch in batches)
    assert len(rebuilt) == len(batches)  # the arrays only: 4 tensor fields a batch, 1 through shared memory


def test_with_pinned_memory_every_field_is_a_tensor_in_the_worker(manifest, rebuilt):
    # without an accelerator the DataLoader warns that it pins nothing; the workers still send tensors
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else contextlib.nullcontext():
        batches = _batches(manifest, 2, pin_memory=True)
    assert len(rebuilt) == 4 * len(batches)

