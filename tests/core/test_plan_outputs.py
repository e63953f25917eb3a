"""Balancing on training samples: a reader stage that expands each shard sample into a known number
of outputs (`outputs_per_sample`); 3 ranks x 2 workers get equal batch counts without `Join`. The
expected outputs come from the counts written here, not from the code under test."""
import collections

import numpy as np
import pytest

import wdsprep

from .shardsets import write_counted_shards
from tests.core.test_plan_oracle import simulated_worker

COUNTS = [7, 7, 7, 7, 7, 7, 7, 1, 23, 2]
RNG = np.random.default_rng(5)
# outputs of sample i of shard s; zeros and one big expansion among small ones
OUTPUTS = {f"s{s:02d}x{i:02d}": int(RNG.choice([0, 1, 2, 3, 9, 40], p=[.1, .3, .2, .2, .15, .05]))
           for s, c in enumerate(COUNTS) for i in range(c)}
WEIGHTS = [OUTPUTS[f"s{s:02d}x{i:02d}"] for s, c in enumerate(COUNTS) for i in range(c)]  # manifest order
EVERY_OUTPUT = {f"{key}/{part}" for key, n in OUTPUTS.items() for part in range(n)}


def _expand(source):
    for sample in source:
        for part in range(OUTPUTS[sample["__key__"]]):
            yield f"{sample['__key__']}/{part}"


@pytest.fixture
def manifest(tmp_path):
    return write_counted_shards(tmp_path / "m", COUNTS)


def _worker_batches(manifest, rank, world, worker, workers, equalize, batch=4, epoch=0):
    dataset = wdsprep.dataset(manifest, "train", rank=rank, world_size=world, seed=2, epoch=epoch, equalize=equalize,
                              outputs_per_sample=WEIGHTS).compose(_expand)
    with simulated_worker(worker, workers):
        outputs = list(dataset)
    return [outputs[i : i + batch] for i in range(0, len(outputs), batch)]


@pytest.mark.parametrize("epoch", [0, 1, 2])
@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_three_ranks_two_workers_get_equal_batches(manifest, equalize, epoch):
    per_rank = []
    for rank in range(3):
        batches = [_worker_batches(manifest, rank, 3, w, 2, equalize, epoch=epoch) for w in range(2)]
        per_rank.append(batches)
    # each worker batches its own stream: equal per-worker batch counts make equal rank batch counts
    for worker in range(2):
        assert len({len(rank[worker]) for rank in per_rank}) == 1
    outputs = [o for rank in per_rank for worker in rank for batch in worker for o in batch]
    counts = collections.Counter(outputs)
    largest = max(OUTPUTS.values())
    if equalize == "pad":
        assert set(counts) == EVERY_OUTPUT
        assert sum(counts.values()) - len(EVERY_OUTPUT) <= 3 * 2 * largest  # repeats: less than a sample per worker
    else:
        assert all(c == 1 for c in counts.values())
        assert len(EVERY_OUTPUT) - len(counts) <= 3 * 2 * largest
    # and the dataset says how many it yields
    dataset = wdsprep.dataset(manifest, "train", rank=0, world_size=3, seed=2, epoch=epoch, equalize=equalize,
                              outputs_per_sample=WEIGHTS)
    assert len(dataset) == sum(len(b) for b in _worker_batches(manifest, 0, 3, 0, 1, equalize, epoch=epoch))
    assert dataset.samples_per_rank(num_workers=2) == sum(len(b) for b in per_rank[0][0] + per_rank[0][1])


def test_loader_with_workers_and_weights_resumes_exactly(manifest):
    def make():
        dataset = wdsprep.dataset(manifest, "train", rank=1, world_size=3, seed=2, epoch=0, equalize="pad",
                                  outputs_per_sample=WEIGHTS).compose(_expand)
        return wdsprep.Loader(dataset, batch_size=3, num_workers=2, collate_fn=list)

    full = list(make())
    loader = make()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(5)]
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


@pytest.mark.parametrize("equalize, rank", [("pad", 1), ("pad", 2), ("drop", 0), ("drop", 2)])
def test_resume_near_the_end_is_exact_while_padding_or_dropping(manifest, equalize, rank):
    def make(equalize=equalize):
        return wdsprep.dataset(manifest, "train", rank=rank, world_size=3, seed=2, epoch=1, equalize=equalize,
                               outputs_per_sample=WEIGHTS).compose(_expand)

    full = list(make())
    assert len(full) != len(list(make(None)))  # the case under test: this rank pads or drops its outputs
    for stop in range(max(0, len(full) - 25), len(full) + 1):
        run = make()
        iterator = iter(run)
        head = [next(iterator) for _ in range(stop)]
        resumed = make()
        resumed.load_state_dict(run.state_dict())
        assert head + list(resumed) == full, stop


@pytest.mark.parametrize("equalize", [None, "pad"])
def test_elastic_resume_with_weights_keeps_ranks_equal(manifest, equalize):
    delivered, states = [], []
    for rank, stop in enumerate([11, 30, 2]):  # mid-sample stops: carried outputs count in the balance
        dataset = wdsprep.dataset(manifest, "train", rank=rank, world_size=3, seed=2, epoch=0, equalize=equalize,
                                  outputs_per_sample=WEIGHTS).compose(_expand)
        iterator = iter(dataset)
        delivered += [o for _, o in zip(range(stop), iterator)]
        states.append(dataset.state_dict())
    lengths = []
    for rank in range(2):
        dataset = wdsprep.dataset(manifest, "train", rank=rank, world_size=2, seed=2, epoch=0, equalize=equalize,
                                  outputs_per_sample=WEIGHTS).compose(_expand)
        dataset.load_state_dict(states)
        expected = len(dataset)
        out = list(dataset)
        assert len(out) == expected
        lengths.append(len(out))
        delivered += out
    counts = collections.Counter(delivered)
    assert set(counts) == EVERY_OUTPUT
    if equalize is None:
        assert abs(lengths[0] - lengths[1]) <= max(OUTPUTS.values())
        assert all(c == 1 for c in counts.values())
    else:
        assert lengths[0] == lengths[1]  # the partly delivered samples count with what they have left
        assert sum(counts.values()) - len(EVERY_OUTPUT) <= 2 * max(OUTPUTS.values())


def test_wrong_number_of_counts_is_refused(manifest):
    with pytest.raises(wdsprep.ConfigError, match="each of the 75 samples"):
        wdsprep.dataset(manifest, "train", outputs_per_sample=WEIGHTS[:-1])


def test_a_worker_whose_samples_make_no_output_still_pads_to_its_target(tmp_path):
    """Samples with 0 outputs can fill a worker's whole run (here rank 1's worker 0 for some seeds):
    with "pad" it replays the rank's (or the pass's) outputs, never gives up with none."""
    counts = [3, 0, 4, 2]
    outputs = {f"s{s:02d}x{i:02d}": (s + 2 * i) % 4 for s, c in enumerate(counts) for i in range(c)}
    weights = [outputs[f"s{s:02d}x{i:02d}"] for s, c in enumerate(counts) for i in range(c)]
    manifest = write_counted_shards(tmp_path / "z", counts)

    def expand(source):
        for sample in source:
            yield from (f"{sample['__key__']}/{j}" for j in range(outputs[sample["__key__"]]))

    for seed in range(6):
        table = {}
        for rank in range(3):
            for worker in range(2):
                dataset = wdsprep.dataset(manifest, "train", rank=rank, world_size=3, seed=seed, epoch=0,
                                          equalize="pad", outputs_per_sample=weights).compose(expand)
                with simulated_worker(worker, 2):
                    table[rank, worker] = list(dataset)
        for worker in range(2):
            assert len({len(table[rank, worker]) for rank in range(3)}) == 1, (seed, worker)
