"""DataLoader workers inherit the pass the main process planned (issue 40).

A dataset made by `wdsprep convert` (CLI) is read through `wdsprep.Loader` with forked workers. The
epoch planner is wrapped in the main process before the workers fork, so every call, in the main
process or a worker, appends its process id to a file: the main process plans once per pass and
no worker plans at all. The batches are those of the reference model of test_plan_oracle.py (the
shard order of (seed, epoch), each worker's contiguous run, its shuffle blocks, round-robin
delivery), with each shard's keys read from the tar files by `tarfile`: epoch after epoch, so a plan
kept from epoch 0 and reused for epoch 1 is caught. The same for a `wdsprep.mix` (against
test_mix_oracle.py's model). Pickling a planned dataset (what spawned workers get) leaves the plan out.
"""
from __future__ import annotations

import json
import os
import pathlib
import pickle
import tarfile

import pytest

import wdsprep
import wdsprep.stream.dataset
import wdsprep.stream.mix

from .test_mix_oracle import make_loader, model_loader_epoch, written, LOADER_PARTS, as_lists
from .test_plan_oracle import model_shard_order, model_worker_stream
from .valueshards import convert_value_shards

SEED = 5
BATCH = 3


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """29 value samples converted by the CLI into shards of a few samples each."""
    return convert_value_shards(tmp_path_factory.mktemp("planning"), 29, 4, "7KB")


def shard_keys(manifest: str) -> list[list[str]]:
    """Each shard's sample keys in the order its tar holds them, read with `tarfile`."""
    root = pathlib.Path(manifest).parent
    rows = json.loads(pathlib.Path(manifest).read_text())["splits"]["train"]["shards"]
    out = []
    for row in rows:
        keys: list[str] = []
        with tarfile.open(root / row["name"]) as tar:
            for member in tar.getmembers():
                key = member.name.split(".", 1)[0]
                if key != "__wdsprep_index__" and (not keys or keys[-1] != key):
                    keys.append(key)
        out.append(keys)
    return out


def model_batches(manifest: str, epoch: int, workers: int, buffer: int) -> list[list[str]]:
    """The batches a Loader of `workers` workers delivers in `epoch`, in delivery order (the model)."""
    keys = shard_keys(manifest)
    items = [key for shard in model_shard_order(len(keys), SEED, epoch, True) for key in keys[shard]]
    streams = [model_worker_stream(items, world=1, rank=0, workers=workers, worker=k, equalize=None, buffer=buffer,
                                   seed=SEED, epoch=epoch) for k in range(workers)]
    batched = [[stream[i : i + BATCH] for i in range(0, len(stream), BATCH)] for stream in streams]
    return [batches[turn] for turn in range(max(map(len, batched))) for batches in batched if turn < len(batches)]


def keys_of(batch: list) -> list[str]:
    return [sample["__key__"] for sample in batch]


def recorded(monkeypatch, module, name: str, log: pathlib.Path) -> None:
    """`module.name` wrapped: each call appends this process's id to `log` (forked workers inherit it)."""
    original = getattr(module, name)

    def planner(*args, **kwargs):
        with open(log, "a") as file:
            file.write(f"{os.getpid()}\n")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, planner)


def plans_by_process(log: pathlib.Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in log.read_text().split() if log.exists() else []:
        counts[int(line)] = counts.get(int(line), 0) + 1
    return counts


def test_the_value_shards_are_several_uneven_ones(converted):
    sizes = [len(keys) for keys in shard_keys(converted)]
    assert len(sizes) >= 6 and sum(sizes) == 29, sizes


@pytest.mark.parametrize("workers, buffer", [(2, 0), (4, 3)])
def test_workers_plan_nothing_and_each_epoch_is_planned_anew(converted, monkeypatch, tmp_path, workers, buffer):
    log = tmp_path / "plans"
    recorded(monkeypatch, wdsprep.stream.dataset, "epoch_sequence", log)
    dataset = wdsprep.dataset(converted, "train", seed=SEED, shuffle_buffer=buffer, equalize=None)
    loader = wdsprep.Loader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=keys_of)
    for epoch in range(3):
        assert [list(batch) for batch in loader] == model_batches(converted, epoch, workers, buffer), epoch
        # one plan per pass, in this process: none in a worker
        assert plans_by_process(log) == {os.getpid(): epoch + 1}
    assert model_batches(converted, 0, workers, buffer) != model_batches(converted, 1, workers, buffer)


def test_a_resumed_pass_is_planned_once_in_the_main_process(converted, monkeypatch, tmp_path):
    """A state saved mid-epoch and loaded by a fresh Loader: the rest of the epoch (the model's), then
    the next epoch; the main process plans each pass once, the workers nothing."""
    expected = model_batches(converted, 0, 2, 3)
    first = wdsprep.Loader(wdsprep.dataset(converted, "train", seed=SEED, shuffle_buffer=3, equalize=None),
                           batch_size=BATCH, num_workers=2, collate_fn=keys_of)
    iterator = iter(first)
    got = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    log = tmp_path / "plans"
    recorded(monkeypatch, wdsprep.stream.dataset, "epoch_sequence", log)
    resumed = wdsprep.Loader(wdsprep.dataset(converted, "train", seed=SEED, shuffle_buffer=3, equalize=None),
                             batch_size=BATCH, num_workers=2, collate_fn=keys_of)
    resumed.load_state_dict(state)
    assert [list(b) for b in got] + [list(b) for b in resumed] == expected
    assert plans_by_process(log) == {os.getpid(): 1}
    assert [list(b) for b in resumed] == model_batches(converted, 1, 2, 3)
    assert plans_by_process(log) == {os.getpid(): 2}


def test_a_mix_is_planned_once_per_part_in_the_main_process(counted_shards, monkeypatch, tmp_path):
    log = tmp_path / "plans"
    recorded(monkeypatch, wdsprep.stream.mix, "part_sequence", log)
    manifests = written(counted_shards, LOADER_PARTS)
    loader = make_loader(manifests, 3, 3, world=2, rank=1, equalize="pad")
    for epoch in range(2):
        assert as_lists(loader) == model_loader_epoch(epoch, workers=3, buffer=3, world=2, rank=1, equalize="pad")
        assert plans_by_process(log) == {os.getpid(): len(LOADER_PARTS) * (epoch + 1)}


@pytest.mark.parametrize("mixed", [False, True])
def test_pickling_a_planned_pipeline_leaves_the_plan_out(converted, monkeypatch, tmp_path, mixed):
    """What a spawned worker gets: the same bytes as before the pass was planned; it plans itself."""
    def make():
        if mixed:
            mix = wdsprep.mix([wdsprep.Part(converted)], seed=SEED)
            mix.epoch_counts()  # kept too: a few numbers, not the plan
            return mix
        return wdsprep.dataset(converted, "train", seed=SEED)

    unplanned = len(pickle.dumps(make()))
    planned = make()
    planned.plan_pass()
    assert len(planned) == 29
    assert len(pickle.dumps(planned)) == unplanned
    log = tmp_path / "plans"
    recorded(monkeypatch, wdsprep.stream.mix if mixed else wdsprep.stream.dataset,
             "part_sequence" if mixed else "epoch_sequence", log)
    copy = pickle.loads(pickle.dumps(planned))
    assert len(copy) == 29
    assert plans_by_process(log) == {os.getpid(): 1}  # the copy planned its pass itself
