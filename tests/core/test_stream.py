"""Streaming: global shuffle before the split, equal ranks, determinism, exact resume."""
import collections

import pytest

import wdsprep
from wdsprep.stream.planning.plan import epoch_sequence, rank_share
from tests.core.test_plan_oracle import simulated_worker


def _keys(manifest_url, *, rank, world, worker=0, workers=1, epoch, equalize="pad", seed=0, monkeypatch=None):
    dataset = wdsprep.dataset(manifest_url, "train", seed=seed, epoch=epoch, equalize=equalize, rank=rank, world_size=world)
    with simulated_worker(worker, workers):
        return [s["__key__"] for s in dataset]


def _rank_keys(manifest_url, rank, epoch, equalize="pad", seed=0, workers=2):
    keys = []
    for worker in range(workers):
        keys += _keys(manifest_url, rank=rank, world=3, worker=worker, workers=workers, epoch=epoch, equalize=equalize, seed=seed)
    return keys


def test_webdataset_would_be_uneven_but_we_are_equal(uneven_manifest):
    for epoch in range(4):
        per_rank = [_rank_keys(uneven_manifest, rank, epoch) for rank in range(3)]
        # from the input: 50 samples over 3 ranks, padded up to ceil(50 / 3) = 17 each
        assert [len(keys) for keys in per_rank] == [17, 17, 17]
        # every sample appears at least once across ranks; 51 - 50 = 1 repeat, the padding
        union = collections.Counter(k for keys in per_rank for k in keys)
        assert len(union) == 50 and sum(union.values()) - 50 == 1
        for keys in per_rank:  # a rank's repeat (if any) is its own first sample, replayed at its end
            repeated = [k for k, count in collections.Counter(keys).items() if count > 1]
            assert repeated in ([], [keys[0]]) and (not repeated or keys[-1] == keys[0]), keys


def test_drop_equalizes_down_without_repeats(uneven_manifest):
    per_rank = [_rank_keys(uneven_manifest, rank, 0, equalize="drop") for rank in range(3)]
    # from the input: 50 samples over 3 ranks, cut down to floor(50 / 3) = 16 each
    assert [len(keys) for keys in per_rank] == [16, 16, 16]
    flat = [k for keys in per_rank for k in keys]
    assert len(flat) == len(set(flat)) == 48


def test_order_changes_across_epochs_and_is_reproducible(uneven_manifest):
    epoch0 = _rank_keys(uneven_manifest, 0, 0)
    assert epoch0 == _rank_keys(uneven_manifest, 0, 0)
    orders = {tuple(_rank_keys(uneven_manifest, 0, epoch)) for epoch in range(5)}
    assert len(orders) > 1
    assert _rank_keys(uneven_manifest, 0, 0, seed=1) != epoch0 or _rank_keys(uneven_manifest, 0, 1, seed=1) != _rank_keys(uneven_manifest, 0, 1)


def test_shards_move_between_ranks_across_epochs(uneven_manifest):
    """webdataset pins shard i to rank i % world; here the permutation comes before the split."""
    owners = collections.defaultdict(set)
    counts = [7, 7, 7, 7, 7, 7, 7, 1]
    for epoch in range(6):
        for rank in range(3):
            for piece in rank_share(epoch_sequence(counts, 0, epoch, True), rank, 3, None)[0]:
                owners[piece.shard].add(rank)
    assert any(len(ranks) > 1 for ranks in owners.values())


def test_env_rank_and_world_size(uneven_manifest, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = wdsprep.dataset(uneven_manifest, "train", epoch=0)
    explicit = wdsprep.dataset(uneven_manifest, "train", epoch=0, rank=2, world_size=3)
    assert [s["__key__"] for s in dataset] == [s["__key__"] for s in explicit]
    assert len(dataset) == len(list(explicit))


def test_auto_epoch_advances_each_full_pass(uneven_manifest):
    dataset = wdsprep.dataset(uneven_manifest, "train", seed=3)
    first = [s["__key__"] for s in dataset]
    second = [s["__key__"] for s in dataset]
    assert first != second and sorted(first) == sorted(second)
    dataset.set_epoch(0)
    assert [s["__key__"] for s in dataset] == first


def _flat_map(source):
    for sample in source:  # a reader-style stage that expands one sample into several
        for part in range(3):
            yield f"{sample['__key__']}/{part}"


@pytest.mark.parametrize("shuffle_buffer", [0, 5])
@pytest.mark.parametrize("stop_after", [1, 17, 40, 149])
def test_single_process_resume_is_exact(uneven_manifest, shuffle_buffer, stop_after):
    def make():
        return wdsprep.dataset(uneven_manifest, "train", seed=7, epoch=2, shuffle_buffer=shuffle_buffer).compose(_flat_map)

    full = list(make())
    assert len(full) == 150
    run = make()
    iterator = iter(run)
    head = [next(iterator) for _ in range(stop_after)]
    state = run.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_resume_with_batched(uneven_manifest):
    def make():
        return wdsprep.dataset(uneven_manifest, "train", seed=1, epoch=0).compose(wdsprep.decode(strip=True)).batched(4, collation_fn=lambda b: [s["__key__"] for s in b])

    full = list(make())
    run = make()
    iterator = iter(run)
    head = [next(iterator) for _ in range(5)]
    resumed = make()
    resumed.load_state_dict(run.state_dict())
    assert head + list(resumed) == full


@pytest.mark.parametrize("stop_after", [1, 6, 11])
def test_loader_resume_with_two_workers_is_exact(uneven_manifest, stop_after):
    def make():
        dataset = wdsprep.dataset(uneven_manifest, "train", seed=5, epoch=1).compose(wdsprep.decode(strip=True))
        return wdsprep.Loader(dataset, batch_size=3, num_workers=2, collate_fn=lambda b: [s["__key__"] for s in b])

    full = list(make())
    assert sorted(k for batch in full for k in batch) == sorted(k for k in _keys(uneven_manifest, rank=0, world=1, epoch=1, seed=5))
    loader = make()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(stop_after)]
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_loader_state_refuses_other_worker_counts(uneven_manifest):
    dataset = wdsprep.dataset(uneven_manifest, "train")
    state = wdsprep.Loader(dataset, batch_size=2, num_workers=2).state_dict()
    with pytest.raises(wdsprep.ConfigError, match="num_workers=2, this loader has 1"):
        wdsprep.Loader(dataset, batch_size=2, num_workers=1).load_state_dict(state)


@pytest.mark.parametrize("stop_after", [1, 5, 9])
def test_torchdata_stateful_dataloader_resumes_exactly_with_two_workers(uneven_manifest, stop_after):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        dataset = wdsprep.dataset(uneven_manifest, "train", seed=3, epoch=1).compose(wdsprep.decode(strip=True))
        return StatefulDataLoader(dataset, batch_size=3, num_workers=2, collate_fn=lambda b: [s["__key__"] for s in b])

    full = list(make())
    written = {f"s{shard:02d}x{i:02d}" for shard, count in enumerate([7, 7, 7, 7, 7, 7, 7, 1]) for i in range(count)}
    assert sorted(k for batch in full for k in batch) == sorted(written)
    loader = make()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(stop_after)]
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    keys = [k for batch in head + rest for k in batch]
    assert len(keys) == len(set(keys)) == 50  # nothing twice, nothing lost
    assert head + rest == full
