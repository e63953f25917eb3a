"""DataLoader workers, epochs and resume against the reference model of test_plan_oracle.py.

What a loader delivers, from the model alone: each of K workers reads its run of the rank's samples
(model_worker_stream: contiguous runs, block shuffle keyed by the worker) and batches it; PyTorch's
DataLoader takes one batch from each worker in turn, skipping a worker that has run out (a batch
never mixes workers). `wdsprep.Loader` (1-4 workers, and 0: in the main process) and torch's own
DataLoaders are driven through the public API over shards of uneven sizes; a state saved after
every batch of three epochs in a row -- inside shuffle blocks, after the last batch of an epoch,
and after the epoch's loop ended -- resumes in a fresh loader to exactly the model's rest, each
sample stamped with the epoch the model says (`__epoch__`), so the restored epoch is checked too.
"""
import json

import pytest

import wdsprep

from .test_plan_oracle import model_global, model_worker_stream

COUNTS = [5, 1, 4, 0, 3, 2]  # 15 samples: a worker's run crosses shards, one shard is empty
BATCH = 2
EPOCHS = 3
SEED = 11


def model_epoch(epoch, *, workers, buffer, world=1, rank=0, equalize=None, batch=BATCH):
    """The batches one epoch delivers, in delivery order: lists of (key, epoch)."""
    items = model_global(COUNTS, SEED, epoch, True)
    streams = []
    for worker in range(max(1, workers)):
        keys = model_worker_stream(items, world=world, rank=rank, workers=max(1, workers), worker=worker,
                                   equalize=equalize, buffer=buffer, seed=SEED, epoch=epoch)
        streams.append([[(key, epoch) for key in keys[i : i + batch]] for i in range(0, len(keys), batch)])
    batches, turn = [], [0] * len(streams)
    while any(turn[w] < len(streams[w]) for w in range(len(streams))):
        for w, stream in enumerate(streams):  # round robin; an exhausted worker is skipped
            if turn[w] < len(stream):
                batches.append(stream[turn[w]])
                turn[w] += 1
    return batches


def _keys_and_epochs(batch):
    return [(sample["__key__"], int(sample["__epoch__"])) for sample in batch]


def _loader(manifest, workers, buffer, **plan):
    dataset = wdsprep.dataset(manifest, "train", seed=SEED, shuffle_buffer=buffer, equalize=plan.pop("equalize", None), **plan)
    dataset = dataset.compose(wdsprep.decode(strip=True, bookkeeping=("__epoch__",)))
    return wdsprep.Loader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=_keys_and_epochs)


def _as_lists(batches):
    return [[tuple(pair) for pair in batch] for batch in batches]


def _saved(loader):
    return json.loads(json.dumps(loader.state_dict()))  # states travel as JSON


@pytest.mark.parametrize("buffer", [0, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
def test_loader_delivers_the_model_and_resumes_from_every_batch(counted_shards, workers, buffer):
    check_every_batch_resumes(counted_shards(COUNTS), workers, buffer)


def check_every_batch_resumes(manifest, workers, buffer):
    """Epoch 1 of COUNTS' shards at `manifest` is the model's, and a state saved after any batch
    resumes to exactly the model's rest (also over packed shards: test_packed.py)."""
    expected = model_epoch(1, workers=workers, buffer=buffer)
    got, states = batches_and_states(_loader(manifest, workers, buffer, epoch=1), _saved)
    assert _as_lists(got) == expected
    for done, state in enumerate(states):
        resumed = _loader(manifest, workers, buffer, epoch=1)
        resumed.load_state_dict(state)
        assert _as_lists(list(resumed)) == expected[done:], done


@pytest.mark.parametrize("workers", [0, 3])
def test_states_saved_across_three_epochs_resume_into_the_epoch_they_were_saved_in(counted_shards, workers):
    """A loader counting epochs itself: states saved before an epoch's first batch, in its middle,
    after its last batch (inside the loop) and after its loop ended, resumed by a fresh loader
    (whose own epoch is 0), deliver exactly the rest of the three epochs, each sample stamped with
    its epoch."""
    manifest = counted_shards(COUNTS)
    expected = [batch for epoch in range(EPOCHS) for batch in model_epoch(epoch, workers=workers, buffer=3)]
    loader = _loader(manifest, workers, 3)
    got, states = [], [(0, _saved(loader))]
    for epoch in range(EPOCHS):
        last = len(model_epoch(epoch, workers=workers, buffer=3))
        for count, batch in enumerate(loader, 1):
            got.append(batch)
            if count in (1, last // 2, last):  # the first, a middle one (inside a shuffle block), the last
                states.append((len(got), _saved(loader)))
        states.append((len(got), _saved(loader)))  # after the epoch's loop ended: the next epoch's start
    assert _as_lists(got) == expected
    for done, state in states:
        rest = resumed_until(lambda: _loader(manifest, workers, 3), state, EPOCHS)
        assert _as_lists(rest) == expected[done:], (done, state["epoch"])


def batches_and_states(loader, save):
    """An epoch's batches, and `save(loader)` before the first and after each (states[n]: after n
    batches, the last one included)."""
    got, states = [], [save(loader)]
    for batch in loader:
        got.append(batch)
        states.append(save(loader))
    return got, states


def resumed_until(make, state, epochs):
    """The batches a fresh loader (`make()`) delivers from `state` on, until its epoch reaches `epochs`."""
    resumed = make()
    resumed.load_state_dict(state)
    rest = []
    while resumed.epoch < epochs:
        rest += list(resumed)
    return rest


@pytest.mark.parametrize("workers", [1, 3])
def test_a_rank_with_padding_resumes_with_its_workers_in_order(counted_shards, workers):
    """Rank 1 of 2 with equalize="pad" (its own first sample repeated at its end) and a shuffle
    buffer, resumed after every batch of one epoch."""
    manifest = counted_shards(COUNTS)
    plan = dict(rank=1, world_size=2, equalize="pad")
    expected = model_epoch(2, workers=workers, buffer=3, world=2, rank=1, equalize="pad")
    loader = _loader(manifest, workers, 3, epoch=2, **plan)
    states, got = [json.loads(json.dumps(loader.state_dict()))], []
    for batch in loader:
        got.append(batch)
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert _as_lists(got) == expected
    for done, state in enumerate(states):
        resumed = _loader(manifest, workers, 3, epoch=2, **plan)
        resumed.load_state_dict(state)
        assert _as_lists(list(resumed)) == expected[done:], done


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
def test_torch_dataloader_over_the_dataset_delivers_the_model_each_epoch(counted_shards, workers):
    """Plain `torch.utils.data.DataLoader` (no resume): each worker reads its own run; the epoch
    is the dataset's (`set_epoch`), since workers iterate copies of it."""
    import torch

    manifest = counted_shards(COUNTS)
    dataset = wdsprep.dataset(manifest, "train", seed=SEED, shuffle_buffer=3, equalize=None).compose(wdsprep.decode(strip=True, bookkeeping=("__epoch__",)))
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=_keys_and_epochs)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert _as_lists(list(loader)) == model_epoch(epoch, workers=workers, buffer=3)


@pytest.mark.parametrize("workers", [1, 3])
def test_torchdata_stateful_dataloader_resumes_from_every_batch_against_the_model(counted_shards, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    manifest = counted_shards(COUNTS)

    def make():
        dataset = wdsprep.dataset(manifest, "train", seed=SEED, epoch=1, shuffle_buffer=3, equalize=None)
        return StatefulDataLoader(dataset.compose(wdsprep.decode(strip=True, bookkeeping=("__epoch__",))), batch_size=BATCH, num_workers=workers,
                                  collate_fn=_keys_and_epochs)

    expected = model_epoch(1, workers=workers, buffer=3)
    loader = make()
    iterator = iter(loader)
    states, got = [loader.state_dict()], []
    for batch in iterator:
        got.append(batch)
        states.append(loader.state_dict())
    assert _as_lists(got) == expected
    for done, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(state)
        assert _as_lists(list(resumed)) == expected[done:], done


def test_single_process_states_of_three_epochs_resume_into_the_right_epoch(counted_shards):
    """`wdsprep.dataset` without workers: a state after every sample of three epochs, including one
    saved after an epoch's last sample and one saved after its loop ended, resumed in a fresh
    dataset (whose own epoch is 0) continues in the epoch the state says."""
    manifest = counted_shards(COUNTS)
    expected = [(key, epoch) for epoch in range(EPOCHS) for key in model_global(COUNTS, SEED, epoch, True)]

    def make():
        return wdsprep.dataset(manifest, "train", seed=SEED, equalize=None)

    dataset, got, states = make(), [], []
    states.append((0, dataset.state_dict()))
    for epoch in range(EPOCHS):
        for sample in dataset:
            got.append((sample["__key__"], sample["__epoch__"]))
            states.append((len(got), json.loads(json.dumps(dataset.state_dict()))))
        states.append((len(got), json.loads(json.dumps(dataset.state_dict()))))
    assert got == expected
    for done, state in states:
        resumed = make()
        resumed.load_state_dict(state)
        rest = []
        while resumed.epoch < EPOCHS:
            rest += [(sample["__key__"], sample["__epoch__"]) for sample in resumed]
        assert rest == expected[done:], (done, state["epoch"])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_left_early_and_iterated_again_goes_on_where_it_stopped(counted_shards, workers):
    """A `break` leaves a pass early; iterating the Loader again goes on from the last batch it
    delivered, in the same epoch (its position is its state: what `load_state_dict(state_dict())`
    would resume), and the epoch advances after its last batch. `set_epoch(e)` starts epoch e from
    its first batch. (torch's DataLoader starts every iteration afresh; wdsprep.Loader keeps its
    place, so a loop that breaks every N steps reads the whole epoch, and a pass a dead worker ended
    goes on with new workers.)"""
    manifest = counted_shards(COUNTS)
    expected = [model_epoch(epoch, workers=workers, buffer=3) for epoch in range(2)]
    loader = _loader(manifest, workers, 3)
    got = []
    for stop in (1, 3):  # left after batch 1, then after batch 3
        for batch in loader:
            got.append(batch)
            if len(got) == stop:
                break
    got += list(loader)  # the rest of epoch 0
    assert _as_lists(got) == expected[0] and loader.epoch == 1
    assert _as_lists([next(iter(loader))]) == expected[1][:1]
    loader.set_epoch(1)
    assert _as_lists(list(loader)) == expected[1]
    dataset = wdsprep.dataset(manifest, "train", seed=SEED, epoch=0, equalize=None)
    first = [sample["__key__"] for sample, _ in zip(dataset, range(3))]
    assert [sample["__key__"] for sample in dataset][:3] == first  # the dataset alone starts its pass over
