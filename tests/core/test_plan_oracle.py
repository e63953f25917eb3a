"""The stream plan against an independent reference model (plain loops, nothing shared with `stream/`).

The model states the plan's contract in the order a reader would check it by hand:
1. shard order: a PCG64 permutation keyed by (seed, epoch) when shuffling shards, else 0..S-1;
2. G: every shard's samples 0..c-1, concatenated in that order (N = len(G));
3. rank r of W reads the contiguous slice of G given by divmod(N, W) (the first `extra` ranks one more);
4. equalize "pad": a short rank appends its own first sample (a rank with none: G[r % N]);
   "drop": a long rank drops its last; None: as dealt;
5. worker k of K reads the k-th of K contiguous runs of the rank's list (same divmod rule);
6. shuffle_buffer B > 1: consecutive blocks of B of a worker's stream, each permuted by PCG64 keyed by
   (seed, epoch, rank, worker, block);
7. resume continues with exactly the rest; an elastic resume (every old rank's state) re-deals the
   samples not delivered yet, in G order, by rules 3-6; a state that does not belong refuses to load.

The real system is driven through the public API only: `wdsprep.dataset(...)` over real shards, ranks
by `rank=`/`world_size=`, DataLoader workers by the WORKER/NUM_WORKERS environment variables, samples
identified by their keys.
"""
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep

EQUALIZE = [None, "pad", "drop"]


# ------------------------------------------------------------------------------ the reference model
def model_shard_order(n_shards, seed, epoch, shuffle):
    if not shuffle:
        return list(range(n_shards))
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED]))
    return [int(i) for i in rng.permutation(n_shards)]


def model_global(counts, seed, epoch, shuffle, tag=""):
    """G as sample keys, in the order the epoch visits them."""
    keys = []
    for shard in model_shard_order(len(counts), seed, epoch, shuffle):
        for i in range(counts[shard]):
            keys.append(f"{tag}s{shard:02d}x{i:02d}")
    return keys


def model_contiguous_run(items, parts, index):
    base, extra = divmod(len(items), parts)
    start = index * base + min(index, extra)
    length = base + (1 if index < extra else 0)
    return list(items[start : start + length])


def model_rank(items, world, rank, equalize):
    mine = model_contiguous_run(items, world, rank)
    base, extra = divmod(len(items), world)
    if equalize == "pad" and extra > 0 and len(mine) == base:
        if mine:
            mine.append(mine[0])
        elif items:
            mine.append(items[rank % len(items)])
    if equalize == "drop" and extra > 0 and len(mine) == base + 1:
        mine.pop()
    return mine


def model_block_shuffle(stream, size, seed, epoch, rank, worker):
    if size <= 1:
        return list(stream)
    out = []
    for block, start in enumerate(range(0, len(stream), size)):
        chunk = stream[start : start + size]
        order = np.random.Generator(np.random.PCG64([seed, epoch, rank, worker, block])).permutation(len(chunk))
        out.extend(chunk[int(i)] for i in order)
    return out


def model_worker_stream(items, *, world, rank, workers, worker, equalize, buffer, seed, epoch):
    """What worker `worker` of rank `rank` yields when the epoch's samples are `items` (G or a remainder)."""
    mine = model_rank(items, world, rank, equalize)
    run = model_contiguous_run(mine, workers, worker)
    return model_block_shuffle(run, buffer, seed, epoch, rank, worker)


# ------------------------------------------------------------------------------ the real system
def simulated_worker(worker, workers):
    """The environment a webdataset-style worker sees (`WORKER`, `NUM_WORKERS`), for a `with` block."""
    return mock.patch.dict(os.environ, WORKER=str(worker), NUM_WORKERS=str(workers))


def open_rank(manifest, *, world, rank, equalize, buffer, seed, epoch, shuffle=True, split="train"):
    return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_shards=shuffle, shuffle_buffer=buffer,
                           equalize=equalize, rank=rank, world_size=world)


def real_worker_stream(manifest, *, workers, worker, **plan):
    with simulated_worker(worker, workers):
        return [sample["__key__"] for sample in open_rank(manifest, **plan)]


def take(iterator, n):
    out = []
    for _ in range(n):
        out.append(next(iterator)["__key__"])
    return out


# ------------------------------------------------------------------------------ strategies
small_counts = st.lists(st.integers(0, 5), min_size=1, max_size=6)
with_a_huge_shard = small_counts.flatmap(lambda c: st.integers(0, len(c)).map(lambda i: c[:i] + [23] + c[i:]))
shard_counts = st.one_of(small_counts, with_a_huge_shard)
seeds = st.one_of(st.integers(0, 3), st.integers(0, 2**40))
epochs = st.integers(0, 5)
buffers = st.sampled_from([0, 1, 2, 3, 5])
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ------------------------------------------------------------------------------ plan
@FAST
@given(counts=shard_counts, seed=seeds, epoch=epochs, shuffle=st.booleans(), world=st.integers(1, 8),
       workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers)
def test_every_rank_and_worker_reads_what_the_model_says(counted_shards, counts, seed, epoch, shuffle, world, workers,
                                                         equalize, buffer):
    manifest = counted_shards(counts)
    items = model_global(counts, seed, epoch, shuffle)
    assert len(items) == sum(counts)
    for rank in range(world):
        for worker in range(workers):
            plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
            expected = model_worker_stream(items, workers=workers, worker=worker, **plan)
            got = real_worker_stream(manifest, workers=workers, worker=worker, shuffle=shuffle, **plan)
            assert got == expected, (rank, worker)


@pytest.mark.parametrize("world, workers, buffer", [(1, 1, 0), (2, 2, 3)])
def test_a_worker_of_more_shards_than_its_first_chunk_reads_what_the_model_says(counted_shards, world, workers, buffer):
    """A worker materialises its pieces a chunk at a time (64 first, then 1,024): 150 shards of 0-3
    samples, as a dataset and as a one-part mix (whose epoch is a run of passes), against the model."""
    counts = [i % 4 for i in range(150)]
    manifest = counted_shards(counts)
    items = model_global(counts, 5, 2, True)
    for rank in range(world):
        for worker in range(workers):
            plan = dict(world=world, rank=rank, equalize=None, buffer=buffer, seed=5, epoch=2)
            expected = model_worker_stream(items, workers=workers, worker=worker, **plan)
            assert real_worker_stream(manifest, workers=workers, worker=worker, **plan) == expected, (rank, worker)
            mix = wdsprep.mix([wdsprep.Part(manifest, weight=1)], seed=5, epoch=2, shuffle_buffer=buffer,
                              equalize=None, rank=rank, world_size=world)
            with simulated_worker(worker, workers):
                assert [sample["__key__"] for sample in mix] == expected, (rank, worker)


@FAST
@given(counts=shard_counts, seed=seeds, epoch=epochs, world=st.integers(1, 8))
def test_rank_counts_and_padding_content_follow_from_the_input_alone(counted_shards, counts, seed, epoch, world):
    """Counts from the input (N and W), padding content from the rank's own list: no shared arithmetic."""
    manifest = counted_shards(counts)
    total = sum(counts)
    padded = [real_worker_stream(manifest, workers=1, worker=0, world=world, rank=r, equalize="pad", buffer=0,
                                 seed=seed, epoch=epoch) for r in range(world)]
    dropped = [real_worker_stream(manifest, workers=1, worker=0, world=world, rank=r, equalize="drop", buffer=0,
                                  seed=seed, epoch=epoch) for r in range(world)]
    as_dealt = [real_worker_stream(manifest, workers=1, worker=0, world=world, rank=r, equalize=None, buffer=0,
                                   seed=seed, epoch=epoch) for r in range(world)]
    ceil, floor = -(-total // world), total // world
    assert [len(keys) for keys in padded] == [ceil if total else 0] * world
    assert [len(keys) for keys in dropped] == [floor] * world
    assert sorted(len(keys) for keys in as_dealt) == sorted([floor + 1] * (total % world) + [floor] * (world - total % world))
    # as dealt: every sample exactly once, in the epoch's global order when the ranks are read one after another
    assert [k for keys in as_dealt for k in keys] == model_global(counts, seed, epoch, True)
    for own, pad in zip(as_dealt, padded, strict=True):
        assert pad[: len(own)] == own  # padding only appends
        extra = pad[len(own):]
        if own:  # a rank's padding is its own first sample, never one from another rank
            assert extra in ([], [own[0]])
    for own, drop in zip(as_dealt, dropped, strict=True):
        assert drop == own[: len(drop)]  # dropping only cuts the end
    if total >= world:  # drop loses exactly total % world samples, each rank at most one
        assert sum(len(own) - len(drop) for own, drop in zip(as_dealt, dropped, strict=True)) == total % world


def test_seed_and_epoch_are_not_interchangeable(counted_shards):
    """(seed s, epoch e + 1) and (seed s + 1, epoch e) must be different epochs (a classic mixing bug)."""
    manifest = counted_shards([3, 1, 4, 1, 5, 2, 6, 0, 2])
    def order(seed, epoch):
        return real_worker_stream(manifest, workers=1, worker=0, world=1, rank=0, equalize=None, buffer=0, seed=seed, epoch=epoch)
    pairs = [(order(s, e + 1), order(s + 1, e)) for s in range(3) for e in range(3)]
    assert all(a != b for a, b in pairs)
    assert order(0, 1) == model_global([3, 1, 4, 1, 5, 2, 6, 0, 2], 0, 1, True)


# ------------------------------------------------------------------------------ resume
@FAST
@given(counts=shard_counts, seed=seeds, epoch=epochs, world=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE),
       buffer=buffers, data=st.data())
def test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest(counted_shards, counts, seed, epoch, world, equalize,
                                                                  buffer, data):
    manifest = counted_shards(counts)
    rank = data.draw(st.integers(0, world - 1), label="rank")
    plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    expected = model_worker_stream(model_global(counts, seed, epoch, True), workers=1, worker=0, **plan)
    first = data.draw(st.integers(0, len(expected)), label="first stop")
    run = open_rank(manifest, **plan)
    head = take(iter(run), first)
    resumed = open_rank(manifest, **plan)
    resumed.load_state_dict(run.state_dict())
    if first == len(expected):
        assert (head, [s["__key__"] for s in resumed]) == (expected, [])
        return
    # the resumed run delivers at least one sample before its own state is saved (saving before
    # that is test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one)
    second = data.draw(st.integers(1, len(expected) - first), label="second stop")
    middle = take(iter(resumed), second)
    again = open_rank(manifest, **plan)
    again.load_state_dict(resumed.state_dict())
    tail = [sample["__key__"] for sample in again]
    assert (head, middle, tail) == (expected[:first], expected[first : first + second], expected[first + second :])


@pytest.mark.parametrize("first", [0, 2, 5])
def test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one(counted_shards, first):
    """A checkpoint taken right after resuming (before the next step) must resume to the same place."""
    counts = [3, 2]
    manifest = counted_shards(counts)
    plan = dict(world=1, rank=0, equalize=None, buffer=0, seed=1, epoch=0)
    expected = model_worker_stream(model_global(counts, 1, 0, True), workers=1, worker=0, **plan)
    run = open_rank(manifest, **plan)
    assert take(iter(run), first) == expected[:first]
    resumed = open_rank(manifest, **plan)
    resumed.load_state_dict(run.state_dict())
    again = open_rank(manifest, **plan)
    again.load_state_dict(resumed.state_dict())
    assert [sample["__key__"] for sample in again] == expected[first:]


def model_remainder(items, world, delivered_per_rank, *, equalize, buffer, seed, epoch):
    """G order minus what every old rank (one worker each) delivered, by position in G. A padding
    repeat delivers nothing: the sample it repeats stays in the remainder until the rank itself
    delivered it (a shuffle buffer can yield the repeat first)."""
    positions = list(range(len(items)))
    delivered = set()
    for rank, count in enumerate(delivered_per_rank):
        own = len(model_contiguous_run(positions, world, rank))
        mine = [(position, i >= own) for i, position in enumerate(model_rank(positions, world, rank, equalize))]
        stream = model_block_shuffle(mine, buffer, seed, epoch, rank, 0)
        delivered.update(position for position, padding in stream[:count] if not padding)
    return [key for position, key in enumerate(items) if position not in delivered]


@FAST
@given(counts=shard_counts, seed=seeds, epoch=epochs, old_world=st.integers(1, 4), new_world=st.integers(1, 4),
       new_workers=st.integers(1, 3), equalize=st.sampled_from([None, "pad"]), buffer=st.sampled_from([0, 3]),
       data=st.data())
def test_elastic_resume_delivers_the_rest_exactly_once(counted_shards, counts, seed, epoch, old_world, new_world,
                                                       new_workers, equalize, buffer, data):
    def draw_stop(rank, length):
        return data.draw(st.integers(0, length), label=f"rank {rank} stop")

    check_elastic_resume(counted_shards, counts, seed, epoch, old_world, new_world, new_workers, equalize, buffer, draw_stop)


def test_elastic_resume_after_a_padding_repeat_shuffled_before_its_sample(counted_shards):
    # rank 1 of 2 (samples 3, 4 and the padding repeat of 3, one shuffle block) delivered the repeat
    # and 4: the repeat delivers nothing, so sample 3 itself is dealt again (an earlier model here
    # counted the repeat as sample 3, disagreeing with test_plan_properties and the plan's rule 7)
    stops = {0: 0, 1: 2}
    check_elastic_resume(counted_shards, [5], 1, 0, 2, 1, 1, "pad", 3, lambda rank, length: stops[rank])


def check_elastic_resume(counted_shards, counts, seed, epoch, old_world, new_world, new_workers, equalize, buffer,
                         draw_stop):
    items = model_global(counts, seed, epoch, True)
    if equalize == "pad" and len(items) < max(old_world, new_world):
        return  # a rank with nothing pads with another rank's sample: "exactly once" does not apply
    manifest = counted_shards(counts)
    old = dict(world=old_world, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    states, stops, delivered_keys = [], [], []
    for rank in range(old_world):
        length = len(model_worker_stream(items, rank=rank, workers=1, worker=0, **old))
        stop = draw_stop(rank, length)
        run = open_rank(manifest, rank=rank, **old)
        delivered_keys += take(iter(run), stop)
        states.append(run.state_dict())
        stops.append(stop)
    rest = model_remainder(items, old_world, stops, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    new = dict(world=new_world, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    for rank in range(new_world):
        for worker in range(new_workers):
            expected = model_worker_stream(rest, rank=rank, workers=new_workers, worker=worker, **new)
            with simulated_worker(worker, new_workers):
                dataset = open_rank(manifest, rank=rank, **new)
                dataset.load_state_dict(states)
                got = [sample["__key__"] for sample in dataset]
            assert got == expected, (rank, worker)
            delivered_keys += got
    if equalize is None:  # what the old run delivered plus what the new one did: every sample exactly once
        assert sorted(delivered_keys) == sorted(items)


# ------------------------------------------------------------------------------ refusals
def _saved_state(manifest, **plan):
    run = open_rank(manifest, **plan)
    take(iter(run), 2)
    return run.state_dict()


PLAN = dict(world=2, rank=0, equalize="pad", buffer=0, seed=3, epoch=1)


def test_a_state_from_another_seed_is_refused(counted_shards):
    manifest = counted_shards([4, 4, 4])
    other = open_rank(manifest, **{**PLAN, "seed": 4})
    with pytest.raises(wdsprep.ConfigError):
        other.load_state_dict(_saved_state(manifest, **PLAN))


def test_a_state_from_another_split_is_refused(tmp_path):
    """Same directory, same shard counts, two splits: only the split differs."""
    from wdsprep.stream import load_manifest

    from .shardsets import write_counted_shards

    both = load_manifest(write_counted_shards(tmp_path, [4, 4, 4], split="train"))
    both.splits.update(load_manifest(write_counted_shards(tmp_path, [4, 4, 4], split="valid")).splits)
    (tmp_path / "manifest.json").write_bytes(both.dumps())
    manifest = str(tmp_path / "manifest.json")
    other = open_rank(manifest, **PLAN, split="valid")
    with pytest.raises(wdsprep.ConfigError):
        other.load_state_dict(_saved_state(manifest, **PLAN))


def test_a_state_from_another_dataset_with_as_many_shards_is_refused(counted_shards):
    state = _saved_state(counted_shards([4, 4, 4]), **PLAN)
    other = open_rank(counted_shards([4, 4, 4], tag="other"), **PLAN)
    with pytest.raises(wdsprep.ConfigError):
        other.load_state_dict(state)


@pytest.mark.parametrize("world", [1, 3])
def test_a_single_rank_state_for_another_world_size_is_refused(counted_shards, world):
    manifest = counted_shards([4, 4, 4])
    other = open_rank(manifest, **{**PLAN, "world": world})
    with pytest.raises(wdsprep.ConfigError):
        other.load_state_dict(_saved_state(manifest, **PLAN))
