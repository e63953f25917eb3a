"""Elastic resume: states saved by W ranks x K workers mid-epoch resume on W' ranks x K' workers; the
two parts together deliver every sample of the epoch exactly once (padding apart). The expected
samples are the keys written into the shards (`s<shard>x<i>`), never values from the code under test."""
import collections
import json

import pytest

import wdsprep

from .shardsets import write_counted_shards

COUNTS = [7, 7, 7, 7, 7, 7, 7, 1, 23, 2]  # one big shard among small ones
ALL_KEYS = {f"s{shard:02d}x{i:02d}" for shard, count in enumerate(COUNTS) for i in range(count)}
PARTS = 3


def _expand(source):
    for sample in source:  # a reader-style stage that expands one shard sample into PARTS outputs
        for part in range(PARTS):
            yield f"{sample['__key__']}/{part}"


@pytest.fixture
def manifest(tmp_path):
    return write_counted_shards(tmp_path / "m", COUNTS)


def _dataset(manifest, rank, world, **options):
    options = {"seed": 4, "epoch": 2, "equalize": None, **options}
    return wdsprep.dataset(manifest, "train", rank=rank, world_size=world, **options).compose(_expand)


def _take(dataset, n):
    iterator = iter(dataset)
    head = [out for _, out in zip(range(n), iterator)]
    return head, json.loads(json.dumps(dataset.state_dict()))  # states travel as JSON


def _every_output_once(outputs):
    counts = collections.Counter(outputs)
    assert [k for k, c in counts.items() if c > 1] == []
    assert set(counts) == {f"{k}/{p}" for k in ALL_KEYS for p in range(PARTS)}


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
@pytest.mark.parametrize("new_world", [1, 2, 5])
def test_three_ranks_resume_on_another_world(manifest, shuffle_buffer, new_world):
    stops = [10, 31, 0]  # outputs each old rank delivered: mid-sample for ranks 0 and 1
    delivered, states = [], []
    for rank, stop in enumerate(stops):
        head, state = _take(_dataset(manifest, rank, 3, shuffle_buffer=shuffle_buffer), stop)
        delivered += head
        states.append(state)
    rest, samples_left = [], 0
    for rank in range(new_world):
        resumed = _dataset(manifest, rank, new_world, shuffle_buffer=shuffle_buffer)
        resumed.load_state_dict(states)
        samples_left += len(resumed)  # this rank's samples of the remainder
        rest += list(resumed)
    # 10 outputs = 3 samples and 1 output of the 4th, 31 = 10 samples and 1 output of the 11th
    assert samples_left == len(ALL_KEYS) - 3 - 10
    assert len(rest) == PARTS * samples_left - 2
    _every_output_once(delivered + rest)


def test_resume_twice_on_changing_worlds(manifest):
    delivered, states = [], []
    for rank, stop in enumerate([5, 17, 2]):
        head, state = _take(_dataset(manifest, rank, 3), stop)
        delivered += head
        states.append(state)
    second = []
    for rank, stop in enumerate([20, 4]):  # interrupted again, on 2 ranks
        resumed = _dataset(manifest, rank, 2)
        resumed.load_state_dict(states)
        head, state = _take(resumed, stop)
        delivered += head
        second.append(state)
    # a state after two interruptions: positions only, whatever the dataset's size
    assert all(len(json.dumps(state)) < 1500 for state in second)
    for rank in range(4):
        resumed = _dataset(manifest, rank, 4)
        resumed.load_state_dict(second)
        delivered += list(resumed)
    _every_output_once(delivered)


def test_padding_repeats_at_most_one_sample_per_rank_after_resume(manifest):
    delivered, states = [], []
    # stops between samples: a sample stopped half-way delivers only its missing outputs after the
    # resume, which a dataset knows the count of only with `outputs_per_sample` (see test_expanding_balance)
    for rank, stop in enumerate([9, 3, 15]):
        head, state = _take(_dataset(manifest, rank, 3, equalize="pad"), stop)
        delivered += head
        states.append(state)
    lengths = []
    for rank in range(4):
        resumed = _dataset(manifest, rank, 4, equalize="pad")
        resumed.load_state_dict(states)
        out = list(resumed)
        lengths.append(len(out))
        delivered += out
    assert len(set(lengths)) == 1  # equal ranks on the remainder too
    counts = collections.Counter(delivered)
    assert set(counts) == {f"{k}/{p}" for k in ALL_KEYS for p in range(PARTS)}
    repeated_samples = {k.split("/")[0] for k, c in counts.items() if c > 1}
    assert len(repeated_samples) <= 3 + 4  # at most one padding sample per rank in each pass


def _loader(manifest, rank, world, workers):
    dataset = wdsprep.dataset(manifest, "train", rank=rank, world_size=world, seed=9, epoch=0,
                              equalize=None).compose(wdsprep.decode(strip=True))
    return wdsprep.Loader(dataset, batch_size=3, num_workers=workers, collate_fn=lambda b: [s["__key__"] for s in b])


def test_loader_with_workers_resumes_on_fewer_ranks_and_other_workers(manifest):
    delivered, states = [], []
    for rank, stop in enumerate([2, 4, 1]):
        loader = _loader(manifest, rank, 3, 2)
        iterator = iter(loader)
        delivered += [k for _, batch in zip(range(stop), iterator) for k in batch]
        states.append(json.loads(json.dumps(loader.state_dict())))
        del iterator
    for rank, workers in enumerate([0, 3]):
        loader = _loader(manifest, rank, 2, workers)
        loader.load_state_dict(states)
        delivered += [k for batch in loader for k in batch]
    counts = collections.Counter(delivered)
    assert [k for k, c in counts.items() if c > 1] == []
    assert set(counts) == ALL_KEYS


def test_states_from_elsewhere_are_refused(manifest, tmp_path):
    states = [_take(_dataset(manifest, rank, 2), 4)[1] for rank in range(2)]
    other = write_counted_shards(tmp_path / "other", [7, 7, 7, 7, 7, 7, 7, 1, 23, 3])
    with pytest.raises(wdsprep.ConfigError, match="dataset="):
        _dataset(other, 0, 2).load_state_dict(states)
    with pytest.raises(wdsprep.ConfigError, match="seed=4"):
        _dataset(manifest, 0, 2, seed=5).load_state_dict(states)
    with pytest.raises(wdsprep.ConfigError, match="world_size=2, this dataset has 3"):
        _dataset(manifest, 0, 3).load_state_dict(states[0])
    with pytest.raises(wdsprep.ConfigError, match="rank=1, this dataset has 0"):
        _dataset(manifest, 0, 2).load_state_dict(states[1])
    with pytest.raises(wdsprep.ConfigError, match="one state per rank"):
        _dataset(manifest, 0, 2).load_state_dict([states[0], states[0]])
    valid = write_counted_shards(tmp_path / "v", COUNTS, split="valid")
    with pytest.raises(wdsprep.ConfigError, match="split='train'"):
        wdsprep.dataset(valid, "valid", rank=0, world_size=2, seed=4, epoch=2, equalize=None).load_state_dict(states)
    loader = _loader(manifest, 0, 2, 2)
    with pytest.raises(wdsprep.ConfigError, match="num_workers=1, this loader has 2"):
        loader.load_state_dict(states[0] | {"seed": 9, "epoch": 0})
