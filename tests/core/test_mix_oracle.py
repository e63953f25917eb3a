"""`wdsprep.mix` against an independent reference model (plain Python over the parts' key lists;
nothing imported from `wdsprep.stream`).

The model states the mix's rules (stream/mix.py M1-M6 over stream/plan.py's rules 1-7) in the order
a reader would check them by hand:
1. sizes: a part's size is its samples (its outputs, when it declares them);
2. epoch counts n_p: weighted, the largest-remainder apportionment of a total S by the weights
   (ties to the lower part index), S = samples_per_epoch, or found by trying every S: the largest
   whose counts all fit the sizes (stop="first"), the smallest whose counts all cover them
   (stop="all"); epochized, size x repeat rounded half up;
3. part p's epoch: passes j = 0, 1, ..., each every shard of the part in the order of a PCG64
   permutation keyed by (seed, epoch, 0x5EED, p, j) ((seed, epoch, 0x5EED) for pass 0 of part 0,
   the order of `wdsprep.dataset`), cut after n_p samples (outputs);
4. each part dealt alone by test_plan_oracle's model (contiguous rank slices, equalize, contiguous
   worker runs), its worker stream block-shuffled with (seed, epoch, rank, worker[, p], block) in
   blocks of its share of the buffer, max(1, round(B n_p / sum n)) (half up);
5. a worker's slots t = 1..T go, among the parts with taken_p < t c_p / T, to the earliest deadline
   (taken_p + 1) / c_p, ties to the lower index; with a shuffle buffer B the labels of each block of
   B slots are permuted by PCG64 (seed, epoch, rank, worker, block, 0x313C);
6. every sample names its part (`__part__`).

The real system is driven through the public API only: `wdsprep.mix([...])` over shards written with
known keys (`<tag>s<shard>x<i>`, one tag per part), ranks by `rank=`/`world_size=`, DataLoader workers
by the WORKER/NUM_WORKERS environment variables or `wdsprep.Loader`.
"""
import collections
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep

from .test_plan_oracle import model_contiguous_run, model_rank, simulated_worker

TAGS = "abcdefgh"
EQUALIZE = [None, "pad", "drop"]


# ------------------------------------------------------------------------------ the reference model
def part_keys(counts, p):
    """Part p's shards as lists of keys (the key naming of `write_counted_shards` with tag TAGS[p])."""
    return [[f"{TAGS[p]}s{shard:02d}x{i:02d}" for i in range(count)] for shard, count in enumerate(counts)]


def model_apportion(total, weights):
    """Hamilton's method: each part the whole part of its quota, then one more to the largest
    fractional parts in turn (ties to the lower index)."""
    whole = sum(Fraction(w) for w in weights)
    quotas = [Fraction(total) * Fraction(w) / whole for w in weights]
    seats = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda p: (seats[p] - quotas[p], p))
    for p in by_remainder[: total - sum(seats)]:
        seats[p] += 1
    return seats


def model_epoch_counts(sizes, shares, *, mode="weighted", stop="first", samples_per_epoch=None):
    if mode == "epochized":
        return [math.floor(size * Fraction(repeat) + Fraction(1, 2)) for size, repeat in zip(sizes, shares)]
    if samples_per_epoch is not None:
        return model_apportion(samples_per_epoch, shares)
    candidates = [model_apportion(total, shares) for total in range(sum(sizes) + 1)]
    if stop == "first":  # of the totals up to all the samples, the largest whose counts all fit
        return [counts for counts in candidates if all(n <= size for n, size in zip(counts, sizes))][-1]
    for total in itertools.count():  # the smallest whose counts cover every part
        counts = model_apportion(total, shares)
        if all(n >= size for n, size in zip(counts, sizes)):
            return counts


def model_pass_order(shards, seed, epoch, part, cycle, shuffle=True):
    if not shuffle:
        return list(range(shards))
    key = [seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED] + ([] if (part, cycle) == (0, 0) else [part, cycle])
    return [int(i) for i in np.random.Generator(np.random.PCG64(key)).permutation(shards)]


def model_part_epoch(shards, count, seed, epoch, part, outputs=None, shuffle=True):
    """Part `part`'s samples in the epoch: passes, each in its own shard order, cut after `count`
    samples (or, with `outputs` (key -> outputs), after the sample that brings them to `count`)."""
    items, taken = [], 0
    for cycle in itertools.count():
        for shard in model_pass_order(len(shards), seed, epoch, part, cycle, shuffle):
            for key in shards[shard]:
                if taken >= count:
                    return items
                items.append(key)
                taken += 1 if outputs is None else outputs[key]


def model_block_shuffle(stream, size, key):
    if size <= 1:
        return list(stream)
    out = []
    for block, start in enumerate(range(0, len(stream), size)):
        chunk = stream[start : start + size]
        order = np.random.Generator(np.random.PCG64([*key, block])).permutation(len(chunk))
        out.extend(chunk[int(i)] for i in order)
    return out


def model_schedule(counts, buffer=0, key=()):
    """Which part each slot of a worker's stream takes (rule 5)."""
    total = sum(counts)
    taken, labels = [0] * len(counts), []
    for t in range(1, total + 1):
        eligible = [p for p, c in enumerate(counts) if taken[p] < Fraction(t * c, total)]
        best = min(eligible, key=lambda p: (Fraction(taken[p] + 1, counts[p]), p))
        taken[best] += 1
        labels.append(best)
    if buffer <= 1:
        return labels
    out = []
    for block, start in enumerate(range(0, total, buffer)):
        chunk = labels[start : start + buffer]
        order = np.random.Generator(np.random.PCG64([*key, block, 0x313C])).permutation(len(chunk))
        out.extend(chunk[int(i)] for i in order)
    return out


def model_interleave(streams, buffer, key):
    """(part, item) of a worker's stream: its parts' streams interleaved by the schedule."""
    sources = [iter(stream) for stream in streams]
    return [(p, next(sources[p])) for p in model_schedule([len(s) for s in streams], buffer, key)]


def part_key(p):
    return () if p == 0 else (p,)


def model_part_buffer(buffer, sizes, p):
    """Rule 4: part p's share of the shuffle buffer, by its share of the epoch (`sizes`: every n_p)."""
    if buffer <= 1:
        return buffer
    share = Fraction(buffer * sizes[p], max(1, sum(sizes)))
    return max(1, math.floor(share + Fraction(1, 2)))


def model_part_streams(epochs, *, world, rank, workers, worker, equalize, buffer, seed, epoch, sizes=None):
    """Each part's stream on one worker, given each part's epoch items (rule 4); `sizes`: the parts'
    epoch counts (after an elastic resume `epochs` are what is left of them)."""
    sizes = [len(items) for items in epochs] if sizes is None else sizes
    streams = []
    for p, items in enumerate(epochs):
        run = model_contiguous_run(model_rank(items, world, rank, equalize), workers, worker)
        streams.append(model_block_shuffle(run, model_part_buffer(buffer, sizes, p),
                                           (seed, epoch, rank, worker, *part_key(p))))
    return streams


def model_epochs(parts, shares, *, seed, epoch, shuffle=True, **sizing):
    """Each part's epoch items (rules 1-3); a part is its shards' sample counts (keys named as
    `part_keys` says) or its shards' key lists."""
    shards = [part_keys(part, p) if all(isinstance(c, int) for c in part) else part for p, part in enumerate(parts)]
    counts = model_epoch_counts([sum(map(len, keys)) for keys in shards], shares, **sizing)
    return [model_part_epoch(keys, n, seed, epoch, p, shuffle=shuffle) for p, (keys, n) in enumerate(zip(shards, counts))]


def model_worker(parts, shares, *, world=1, rank=0, workers=1, worker=0, equalize=None, buffer=0, seed=0, epoch=0,
                 shuffle=True, **sizing):
    """(part name, key) of what one worker of one rank yields; REFUSED when equalize="drop" would
    leave a part out on every rank (fewer samples in the epoch than ranks: every rank drops its one)."""
    epochs = model_epochs(parts, shares, seed=seed, epoch=epoch, shuffle=shuffle, **sizing)
    if equalize == "drop" and world > 1 and any(len(items) < world for items in epochs):
        return REFUSED
    streams = model_part_streams(epochs, world=world, rank=rank, workers=workers, worker=worker, equalize=equalize,
                                 buffer=buffer, seed=seed, epoch=epoch)
    return [(str(p), key) for p, key in model_interleave(streams, buffer, (seed, epoch, rank, worker))]


# ------------------------------------------------------------------------------ the real system
def open_mix(manifests, shares, *, mode="weighted", world=1, rank=0, equalize=None, buffer=0, seed=0, epoch=0,
             decoded=False, **options):
    """The mix; `decoded`: each part decodes its samples (`wdsprep.decode()`, fused into its reader:
    the mix then takes the samples of local parts itself, stream/mix.py `_taken_in_turn`)."""
    share = "weight" if mode == "weighted" else "repeat"
    parts = [{"location": m, share: s, **({"stages": (wdsprep.decode(),)} if decoded else {})}
             for m, s in zip(manifests, shares)]
    return wdsprep.mix(parts, mode=mode, seed=seed, epoch=epoch, shuffle_buffer=buffer, equalize=equalize,
                       rank=rank, world_size=world, **options)


def named(sample):
    return sample["__part__"], sample["__key__"]


REFUSED = "refused: equalize='drop' would leave a part out"


def real_worker(manifests, shares, *, workers=1, worker=0, **plan):
    with simulated_worker(worker, workers):
        try:
            return [named(sample) for sample in open_mix(manifests, shares, **plan)]
        except wdsprep.ConfigError as error:
            if "equalize='drop' would leave it out on every rank" in str(error):
                return REFUSED
            raise


def written(counted_shards, parts, packed=False):
    """Each part's counted shards (`packed`: its samples in blocks of two)."""
    return [counted_shards(counts, tag=TAGS[p], pack_rows=2 if packed else None) for p, counts in enumerate(parts)]


# ------------------------------------------------------------------------------ strategies
part_counts = st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda c: sum(c) > 0)
mix_parts = st.lists(part_counts, min_size=1, max_size=3)
weight_values = st.sampled_from([1, 2, 3, 0.5, 0.25, 1.5, 7])
repeat_values = st.sampled_from([0.25, 0.5, 1, 1.5, 2, 3])
seeds = st.one_of(st.integers(0, 3), st.integers(0, 2**40))
epochs = st.integers(0, 5)
buffers = st.sampled_from([0, 1, 2, 3, 5])
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ------------------------------------------------------------------------------ epoch counts
def test_epoch_counts_in_words():
    """Hand-checked cases of rule 2 (the model, before the model is trusted)."""
    # 2:1 over sizes 9 and 6: S = 14 gives 9.33 -> 9 and 4.67 -> 5 (the larger remainder), both fit;
    # S = 15 gives 10 > 9
    assert model_epoch_counts([9, 6], [2, 1], stop="first") == [9, 5]
    # S = 17 gives 11.33 -> 11 and 5.67 -> 6: both covered; S = 16 gives 10.67 -> 11 and 5.33 -> 5 < 6
    assert model_epoch_counts([9, 6], [2, 1], stop="all") == [11, 6]
    assert model_epoch_counts([9, 6], [1, 1], samples_per_epoch=5) == [3, 2]  # a tie: the lower index
    assert model_epoch_counts([10, 3], [0.25, 1.5], mode="epochized") == [3, 5]  # 2.5 -> 3, 4.5 -> 5


@FAST
@given(parts=mix_parts, weights=st.lists(weight_values, min_size=3, max_size=3),
       stop=st.sampled_from(["first", "all"]), samples_per_epoch=st.one_of(st.none(), st.integers(1, 40)))
def test_weighted_epoch_counts_are_the_models(counted_shards, parts, weights, stop, samples_per_epoch):
    weights = weights[: len(parts)]
    mix = open_mix(written(counted_shards, parts), weights, stop=stop, samples_per_epoch=samples_per_epoch)
    expected = model_epoch_counts([sum(c) for c in parts], weights, stop=stop, samples_per_epoch=samples_per_epoch)
    assert mix.epoch_counts() == expected
    assert len(mix) == sum(expected)


def test_epochized_epoch_counts_are_the_models(counted_shards):
    parts, repeats = [[3, 0, 4], [5], [1, 1]], [0.25, 1, 3]
    mix = open_mix(written(counted_shards, parts), repeats, mode="epochized")
    assert mix.epoch_counts() == model_epoch_counts([7, 5, 2], repeats, mode="epochized") == [2, 5, 6]


# ------------------------------------------------------------------------------ what each worker reads
@FAST
@given(parts=mix_parts, weights=st.lists(weight_values, min_size=3, max_size=3), stop=st.sampled_from(["first", "all"]),
       samples_per_epoch=st.one_of(st.none(), st.integers(1, 30)), seed=seeds, epoch=epochs, world=st.integers(1, 5),
       workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers, decoded=st.booleans(),
       packed=st.booleans())
def test_weighted_every_rank_and_worker_reads_what_the_model_says(counted_shards, parts, weights, stop,
                                                                  samples_per_epoch, seed, epoch, world, workers,
                                                                  equalize, buffer, decoded, packed):
    weights = weights[: len(parts)]
    manifests = written(counted_shards, parts, packed)
    sizing = dict(stop=stop, samples_per_epoch=samples_per_epoch)
    for rank in range(world):
        for worker in range(workers):
            plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
            expected = model_worker(parts, weights, workers=workers, worker=worker, **plan, **sizing)
            got = real_worker(manifests, weights, workers=workers, worker=worker, decoded=decoded, **plan, **sizing)
            assert got == expected, (rank, worker)


@FAST
@given(parts=mix_parts, repeats=st.lists(repeat_values, min_size=3, max_size=3), seed=seeds, epoch=epochs,
       world=st.integers(1, 5), workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers)
def test_epochized_every_rank_and_worker_reads_what_the_model_says(counted_shards, parts, repeats, seed, epoch, world,
                                                                   workers, equalize, buffer):
    repeats = repeats[: len(parts)]
    manifests = written(counted_shards, parts)
    for rank in range(world):
        for worker in range(workers):
            plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
            expected = model_worker(parts, repeats, workers=workers, worker=worker, mode="epochized", **plan)
            got = real_worker(manifests, repeats, workers=workers, worker=worker, mode="epochized", **plan)
            assert got == expected, (rank, worker)


def test_without_shard_shuffling_every_pass_keeps_the_manifest_order(counted_shards):
    parts, weights = [[3, 0, 2], [4, 1]], [1, 3]
    manifests = written(counted_shards, parts)
    unshuffled, shuffled = [], []
    for rank in range(2):
        plan = dict(world=2, rank=rank, equalize="pad", buffer=0, seed=5, epoch=2, stop="all")
        unshuffled.append(model_worker(parts, weights, shuffle=False, **plan))
        shuffled.append(model_worker(parts, weights, **plan))
        assert real_worker(manifests, weights, shuffle_shards=False, **plan) == unshuffled[-1], rank
    assert unshuffled != shuffled  # the case differs from a shuffled one


@pytest.mark.parametrize("buffer", [0, 3])
def test_a_part_narrowed_by_a_selection_is_planned_on_its_kept_samples(counted_shards, buffer):
    """Part 0 keeps some keys (one shard keeps none), part 1 its first 5 samples in manifest order;
    the model's parts are the kept keys of each shard."""
    parts = [[3, 2, 4], [4, 3]]
    manifests = written(counted_shards, parts)
    kept = ["as00x02", "as00x00", "as02x01", "as02x03", "as02x02"]
    selected = [[[key for key in shard if key in kept] for shard in part_keys(parts[0], 0)],
                [shard[: max(0, 5 - sum(map(len, part_keys(parts[1], 1)[:i])))] for i, shard in
                 enumerate(part_keys(parts[1], 1))]]
    assert [sum(map(len, part)) for part in selected] == [5, 5] and selected[0][1] == []
    for rank in range(2):
        for worker in range(2):
            plan = dict(world=2, rank=rank, workers=2, worker=worker, equalize="pad", buffer=buffer, seed=4,
                        epoch=1, stop="all")
            expected = model_worker(selected, [2, 1], **plan)
            with simulated_worker(worker, 2):
                mix = wdsprep.mix([{"location": manifests[0], "weight": 2, "keys": kept},
                                   {"location": manifests[1], "limit": 5}], seed=4, epoch=1, stop="all",
                                  shuffle_buffer=buffer, rank=rank, world_size=2)
                assert [named(s) for s in mix] == expected, (rank, worker)


# ------------------------------------------------------------------------------ proportions
def prefix_deviations(stream, names, buffer):
    """max over checked prefixes and parts of |taken_p(t) - t * c_p / T| (c_p: the stream's own
    count of part p); every prefix without a shuffle buffer, the block ends with one."""
    totals = collections.Counter(stream)
    length, taken, worst = len(stream), collections.Counter(), Fraction(0)
    for t, name in enumerate(stream, 1):
        taken[name] += 1
        if buffer <= 1 or t % buffer == 0 or t == length:
            worst = max([worst, *(abs(taken[n] - Fraction(t * totals[n], length)) for n in names)])
    return worst


@FAST
@given(parts=mix_parts, weights=st.lists(weight_values, min_size=3, max_size=3), stop=st.sampled_from(["first", "all"]),
       samples_per_epoch=st.one_of(st.none(), st.integers(1, 30)), seed=seeds, world=st.integers(1, 5),
       workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers)
def test_weighted_every_prefix_of_every_worker_holds_each_part_within_one_of_its_share(
        counted_shards, parts, weights, stop, samples_per_epoch, seed, world, workers, equalize, buffer):
    weights = weights[: len(parts)]
    manifests = written(counted_shards, parts)
    names = [str(p) for p in range(len(parts))]
    per_rank = collections.defaultdict(list)
    for rank in range(world):
        for worker in range(workers):
            got = real_worker(manifests, weights, workers=workers, worker=worker, world=world, rank=rank,
                              equalize=equalize, buffer=buffer, seed=seed, stop=stop,
                              samples_per_epoch=samples_per_epoch)
            if got == REFUSED:
                return
            assert prefix_deviations([name for name, _ in got], names, buffer) < 1, (rank, worker)
            per_rank[worker].append(collections.Counter(name for name, _ in got))
    if equalize is not None:  # every rank: the same count of each part on each worker, hence the same total
        for worker, counts in per_rank.items():
            assert all(count == counts[0] for count in counts), worker


def test_the_prefix_bound_is_checked_on_a_stream_that_drifts():
    """The property's own check: a stream that takes one part twice too early is caught."""
    assert prefix_deviations(list("abbaab"), "ab", 0) < 1
    assert prefix_deviations(list("aabbba"), "ab", 0) >= 1  # after "aa": 2 where 1 is due
    assert prefix_deviations(list("aabbba"), "ab", 3) < 1  # with a buffer of 3: only block ends count
    assert prefix_deviations(list("aaabbb"), "ab", 3) >= 1  # at the end of the first block of 3


@FAST
@given(parts=mix_parts, repeats=st.lists(repeat_values, min_size=3, max_size=3), seed=seeds, epoch=epochs,
       world=st.integers(1, 5), workers=st.integers(1, 4), buffer=buffers)
def test_epochized_gives_each_part_exactly_its_count(counted_shards, parts, repeats, seed, epoch, world, workers,
                                                     buffer):
    """Over every rank and worker (dealt as is): part p's samples are round(repeat x size) of its
    keys, each key as often as whole passes plus the partial pass say, counted from the key lists."""
    repeats = repeats[: len(parts)]
    manifests = written(counted_shards, parts)
    got = collections.Counter()
    for rank in range(world):
        for worker in range(workers):
            got.update(real_worker(manifests, repeats, mode="epochized", workers=workers, worker=worker, world=world,
                                   rank=rank, equalize=None, buffer=buffer, seed=seed, epoch=epoch))
    for p, counts in enumerate(parts):
        keys = [key for shard in part_keys(counts, p) for key in shard]
        wanted = math.floor(len(keys) * Fraction(repeats[p]) + Fraction(1, 2))
        mine = {key: n for (name, key), n in got.items() if name == str(p)}
        assert sum(mine.values()) == wanted
        whole, rest = divmod(wanted, len(keys))
        multiplicities = [whole + 1] * rest + [whole] * (len(keys) - rest)  # whole passes, then part of one more
        assert sorted(mine.values(), reverse=True) == [m for m in multiplicities if m]


# ------------------------------------------------------------------------------ through wdsprep.Loader
LOADER_PARTS = [[3, 1, 0, 2], [4], [2, 2]]  # 6 + 4 + 4 samples; a worker's run crosses shards
LOADER_WEIGHTS = [2, 1, 1.5]
BATCH = 2


def model_loader_epoch(epoch, *, workers, buffer, world=1, rank=0, equalize=None, seed=11, stop="all", batch=BATCH,
                       parts=LOADER_PARTS, weights=LOADER_WEIGHTS):
    """The batches one epoch of a Loader delivers, in delivery order: lists of (part, key, epoch).
    Each worker batches its own stream; the DataLoader takes one batch from each worker in turn,
    skipping a worker that has run out."""
    streams = []
    for worker in range(max(1, workers)):
        items = model_worker(parts, weights, world=world, rank=rank, workers=max(1, workers), worker=worker,
                             equalize=equalize, buffer=buffer, seed=seed, epoch=epoch, stop=stop)
        streams.append([(name, key, epoch) for name, key in items])
    return [items for _, items in round_robin_batches(streams, batch)]


def round_robin_batches(streams, batch):
    """(worker, batch) in the order a DataLoader delivers them: each worker batches its own stream,
    one batch from each worker in turn, a worker that has run out skipped."""
    batched = [[stream[i : i + batch] for i in range(0, len(stream), batch)] for stream in streams]
    return [(worker, batches[turn]) for turn in range(max(map(len, batched), default=0))
            for worker, batches in enumerate(batched) if turn < len(batches)]


def loader_collate(batch):
    return [(sample["__part__"], sample["__key__"], int(sample["__epoch__"])) for sample in batch]


def make_loader(manifests, workers, buffer, *, world=1, rank=0, equalize=None, seed=11, stop="all", epoch=None,
                weights=LOADER_WEIGHTS, decoded=False):
    """`decoded`: each part decodes its samples, keeping `__epoch__` (see `open_mix`)."""
    stages = (wdsprep.decode(bookkeeping="__epoch__"),) if decoded else ()
    parts = [wdsprep.Part(m, weight=w, stages=stages) for m, w in zip(manifests, weights)]
    mix = wdsprep.mix(parts, seed=seed, epoch=epoch, stop=stop, shuffle_buffer=buffer, equalize=equalize, rank=rank,
                      world_size=world)
    return wdsprep.Loader(mix, batch_size=BATCH, num_workers=workers, collate_fn=loader_collate)


def as_lists(batches):
    return [[tuple(item) for item in batch] for batch in batches]


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("buffer", [0, 3])
@pytest.mark.parametrize("decoded", [False, True])
def test_the_loader_delivers_the_models_batches_on_each_rank(counted_shards, workers, buffer, decoded):
    manifests = written(counted_shards, LOADER_PARTS, packed=decoded)
    for rank in range(2):
        plan = dict(world=2, rank=rank, equalize="pad", buffer=buffer)
        loader = make_loader(manifests, workers, epoch=1, decoded=decoded, **plan)
        assert as_lists(loader) == model_loader_epoch(1, workers=workers, **plan), rank


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=4).filter(any), buffer=st.sampled_from([0, 1, 2, 3, 4, 7]),
       start=st.integers(0, 40), at_once=st.integers(1, 9), kept=st.booleans())
def test_a_workers_schedule_from_any_slot_is_the_models_rest(counts, buffer, start, at_once, kept):
    """Rule 5's schedule from slot `start` on (where a resumed worker starts), made whole (a worker's
    counts of at most KEPT_SLOTS slots) or a few slots at a time (more): the model's schedule cut at
    `start`, run after run."""
    from unittest import mock

    from wdsprep.stream import mix

    key = (3, 1, 0, 0)  # kept: made whole; else a few slots (whole blocks) at a time
    sizes = {"KEPT_SLOTS": mix.KEPT_SLOTS if kept else 0, "SLOTS_AT_ONCE": at_once}
    with mock.patch.multiple(mix, **sizes):
        got = [label for run in mix.interleave(counts, start, buffer, key) for label in run]
    assert got == model_schedule(counts, buffer, key)[start:]
