"""Mixture schedules (`wdsprep.mix(parts, schedule=[(start, weights), ...])`, stream/mix.py rules
M7 and M8) against the reference model of test_mix_oracle, extended here to phases in plain Python
(nothing imported from `wdsprep.stream`):

1. a phase starts at a sample position (a whole number) or at floor(f * S) for a fraction f of the
   epoch's S samples (f read as the decimal it is written as); phase k's L_k samples are apportioned
   by its weights (largest remainders, ties to the lower part, a weight 0 gets none);
2. S is samples_per_epoch, or found by trying every total: the largest whose per-part sums over the
   phases fit every part (stop="first"), the smallest whose sums cover every part (stop="all"),
   with sample-position starts a total past the last start;
3. each part's epoch items (the oracle's passes, cut after its sum) are cut into consecutive
   segments, phase k's its next n_k,p items;
4. each phase is a mix of its own, dealt and interleaved by the oracle's model; phase 0 keyed as a
   mix without a schedule, phase k > 0 with (0x9A5E, k) after the worker (after the part) in every
   key; each part's shuffle-buffer share by its share of the phase; a worker's stream is its phases
   one after the other, each sample naming its phase (`__phase__`).

The real system is driven through the public API: `wdsprep.mix`, `wdsprep.Loader`, mix files and
`wdsprep inspect`.
"""
import collections
import itertools
import json
import math
import re
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import wdsprep
import wdsprep.stream.mix as mix_module
from wdsprep.stream.worker import FIRST_CHUNK

from tests.timeouts import SUBPROCESS

from .test_mix_oracle import (
    EQUALIZE,
    FAST,
    buffers,
    model_apportion,
    model_block_shuffle,
    model_contiguous_run,
    model_part_buffer,
    model_part_epoch,
    model_rank,
    model_schedule,
    part_key,
    part_keys,
    prefix_deviations,
    round_robin_batches,
    written,
)
from .test_mix_resume import resumed_from, resumed_twice, resumes_across_epochs, resumes_after_every_batch, saved, take
from .test_plan_bounds import budget, model_keys, one_line_refusal
from .test_plan_oracle import simulated_worker

REFUSED = "refused"


# ------------------------------------------------------------------------------ the model of a schedule
def model_bounds(schedule, total):
    """Where each phase starts in an epoch of `total` samples, then `total`."""
    starts = [start if isinstance(start, int) else math.floor(Fraction(str(start)) * total) for start, _ in schedule]
    return starts + [total]


def model_phase_counts(sizes, schedule, *, stop="first", samples_per_epoch=None):
    """Per phase, per part: the samples the epoch holds (rules 1-2), or REFUSED when no total fits."""

    def counts_at(total):
        bounds = model_bounds(schedule, total)
        return [model_apportion(end - begin, weights) for (begin, end), (_, weights)
                in zip(zip(bounds, bounds[1:]), schedule)]

    def sums(phases):
        return [sum(column) for column in zip(*phases)]

    if samples_per_epoch is not None:
        return counts_at(samples_per_epoch)
    positions = [start for start, _ in schedule[1:] if isinstance(start, int)]
    least = max(positions) + 1 if positions else 1
    if stop == "first":
        fitting = [total for total in range(least, sum(sizes) + 1)
                   if all(n <= size for n, size in zip(sums(counts_at(total)), sizes))]
        return counts_at(fitting[-1]) if fitting else REFUSED
    # past the last sample-position start only the last phase grows: a part it weighs 0 never grows
    last = schedule[-1][1]
    if positions and any(not last[p] and n < size for p, (n, size) in enumerate(zip(sums(counts_at(least)), sizes))):
        return REFUSED
    for total in itertools.count(least):
        if all(n >= size for n, size in zip(sums(counts_at(total)), sizes)):
            return counts_at(total)


def phase_key(k):
    return () if k == 0 else (0x9A5E, k)


def model_segments(items, counts):
    """A part's epoch items cut into consecutive segments of `counts` items (rule 3)."""
    ends = list(itertools.accumulate(counts, initial=0))
    return [items[begin:end] for begin, end in zip(ends, ends[1:])]


def model_phase_epochs(parts, schedule, *, seed, epoch, shuffle=True, **sizing):
    """(per phase counts, per phase per part the phase's items) of an epoch, or REFUSED."""
    shards = [part_keys(part, p) for p, part in enumerate(parts)]
    counts = model_phase_counts([sum(part) for part in parts], schedule, **sizing)
    if counts == REFUSED:
        return REFUSED, None
    totals = [sum(column) for column in zip(*counts)]
    epochs = [model_part_epoch(keys, n, seed, epoch, p, shuffle=shuffle) for p, (keys, n) in enumerate(zip(shards, totals))]
    segments = [model_segments(items, [phase[p] for phase in counts]) for p, items in enumerate(epochs)]
    return counts, [[segments[p][k] for p in range(len(parts))] for k in range(len(counts))]


def model_phase_stream(segments, counts, k, *, world, rank, workers, worker, equalize, buffer, seed, epoch):
    """One worker's (part, item) of phase k (rule 4)."""
    streams = []
    for p, items in enumerate(segments):
        run = model_contiguous_run(model_rank(items, world, rank, equalize), workers, worker)
        streams.append(model_block_shuffle(run, model_part_buffer(buffer, counts, p),
                                           (seed, epoch, rank, worker, *part_key(p), *phase_key(k))))
    labels = model_schedule([len(s) for s in streams], buffer, (seed, epoch, rank, worker, *phase_key(k)))
    sources = [iter(s) for s in streams]
    return [(p, next(sources[p])) for p in labels]


def model_scheduled_worker(parts, schedule, *, world=1, rank=0, workers=1, worker=0, equalize=None, buffer=0, seed=0,
                           epoch=0, shuffle=True, **sizing):
    """(phase, part name, key) of what one worker of one rank yields, or REFUSED (no total fits, or
    equalize="drop" would leave out on every rank a part that a phase weighs)."""
    counts, phases = model_phase_epochs(parts, schedule, seed=seed, epoch=epoch, shuffle=shuffle, **sizing)
    if counts == REFUSED:
        return REFUSED
    if equalize == "drop" and world > 1 and any(
            weight and len(items) < world for (_, weights), segments in zip(schedule, phases)
            for weight, items in zip(weights, segments)):
        return REFUSED
    out = []
    for k, segments in enumerate(phases):
        stream = model_phase_stream(segments, counts[k], k, world=world, rank=rank, workers=workers, worker=worker,
                                    equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
        out += [(k, str(p), key) for p, key in stream]
    if len(schedule) == 1:  # one phase: a mix without a schedule, no __phase__
        return [(None, name, key) for _, name, key in out]
    return out


# ------------------------------------------------------------------------------ the real system
def scheduled_mix(manifests, schedule, *, world=1, rank=0, equalize=None, buffer=0, seed=0, epoch=0, **options):
    parts = [{"location": m} for m in manifests]
    return wdsprep.mix(parts, schedule=schedule, seed=seed, epoch=epoch, shuffle_buffer=buffer, equalize=equalize,
                       rank=rank, world_size=world, **options)


def phased(sample):
    return sample.get("__phase__"), sample["__part__"], sample["__key__"]


def real_scheduled_worker(manifests, schedule, *, workers=1, worker=0, **plan):
    with simulated_worker(worker, workers):
        try:
            return [phased(sample) for sample in scheduled_mix(manifests, schedule, **plan)]
        except wdsprep.ConfigError as error:
            if "would leave it out on every rank" in str(error) or "runs out before the last phase" in str(error) \
                    or "no epoch holds it whole" in str(error):
                return REFUSED
            raise


# ------------------------------------------------------------------------------ strategies
part_counts = st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(lambda c: sum(c) > 0)
mix_parts = st.lists(part_counts, min_size=2, max_size=3)
weight_values = st.sampled_from([0, 0, 1, 2, 3, 0.5, 1.5])
FRACTIONS = [0.1, 0.25, Fraction(1, 3), 0.4, 0.5, 0.6, 0.75, 0.9]


@st.composite
def schedules(draw, parts, positions_below=None):
    """A schedule of 1-4 phases over `parts` parts: starts all fractions or all sample positions
    (below `positions_below` when given), each phase with a weight > 0, every part > 0 somewhere."""
    phases = draw(st.integers(1, 4))
    if draw(st.booleans()):
        later = sorted(draw(st.sets(st.sampled_from(FRACTIONS), min_size=phases - 1, max_size=phases - 1)), key=float)
    else:
        top = 24 if positions_below is None else positions_below  # a later phase starts at 1 .. top - 1
        assume(top - 1 >= phases - 1)
        later = sorted(draw(st.sets(st.integers(1, top - 1), min_size=phases - 1, max_size=phases - 1))) if phases > 1 else []
    starts = [0, *later]
    table = [[draw(weight_values) for _ in range(parts)] for _ in starts]
    for row in table:
        if not any(row):
            row[draw(st.integers(0, parts - 1))] = 1
    for p in range(parts):
        if not any(row[p] for row in table):
            table[draw(st.integers(0, len(table) - 1))][p] = 2
    return list(zip(starts, table))


seeds = st.one_of(st.integers(0, 3), st.integers(0, 2**40))


# ------------------------------------------------------------------------------ phase counts
def test_phase_counts_in_words():
    """Hand-checked cases of rules 1-2 (the model, before the model is trusted)."""
    # 12 samples, phases at 0 and 0.5: [0, 6) all part a, [6, 12) half and half
    assert model_phase_counts([9, 9], [(0, [1, 0]), (0.5, [1, 1])], samples_per_epoch=12) == [[6, 0], [3, 3]]
    # 0.3 of 10 is 3 (as written), not 2 (the float 0.3 is a hair below 3/10)
    assert model_bounds([(0, [1]), (0.3, [1])], 10) == [0, 3, 10]
    # parts of 7 and 7, b only in the second half at 1:1: b's 7 need S/4 >= 7, S = 27 gives 13 + (7, 7)
    assert model_phase_counts([7, 7], [(0, [1, 0]), (0.5, [1, 1])], stop="all") == [[13, 0], [7, 7]]
    # positions: phase 1 from sample 3; the largest epoch in which no part runs out: 3 + 8 (a: 3 + 4 = 7)
    assert model_phase_counts([7, 7], [(0, [1, 0]), (3, [1, 1])], stop="first") == [[3, 0], [4, 4]]
    # a part of weight 0 in the last phase that the phases before never fill: no epoch covers it
    assert model_phase_counts([7, 2], [(0, [1, 1]), (2, [1, 0])], stop="all") == REFUSED


def test_a_schedule_read_back_from_a_state_is_the_same_schedule_and_hashes_alike():
    """An epoch's counts are kept by schedule: the schedule a state records (no words of the user's)
    is the mix's own, equal and with one hash; another schedule is not."""
    names = ["a", "b", "c"]
    written = mix_module.schedule_of([(0, [3, 2, 1]), (0.25, {"a": 4, "b": 1, "c": 1})], names)
    saved = mix_module._saved_schedule(json.loads(json.dumps(written.layout())), len(names))
    assert saved.given == () and written.given
    assert saved == written and hash(saved) == hash(written) and {written: "counts"}[saved] == "counts"
    assert mix_module.schedule_of([(0, [3, 2, 1]), (0.25, [1, 4, 1])], names) != written


@FAST
@given(parts=mix_parts, data=st.data(), stop=st.sampled_from(["first", "all"]),
       samples_per_epoch=st.one_of(st.none(), st.integers(1, 40)))
def test_phase_counts_are_the_models(counted_shards, parts, data, stop, samples_per_epoch):
    schedule = data.draw(schedules(len(parts), positions_below=samples_per_epoch), label="schedule")
    manifests = written(counted_shards, parts)
    expected = model_phase_counts([sum(c) for c in parts], schedule, stop=stop, samples_per_epoch=samples_per_epoch)
    if expected == REFUSED:
        message = one_line_refusal(lambda: scheduled_mix(manifests, schedule, stop=stop,
                                                         samples_per_epoch=samples_per_epoch))
        assert "runs out before the last phase" in message or "no epoch holds it whole" in message
        return
    mix = scheduled_mix(manifests, schedule, stop=stop, samples_per_epoch=samples_per_epoch)
    assert mix.phase_counts() == expected
    assert mix.epoch_counts() == [sum(column) for column in zip(*expected)]
    assert len(mix) == sum(map(sum, expected))


@FAST
@given(sizes=st.lists(st.integers(1, 40), min_size=2, max_size=3), data=st.data(),
       skew=st.sampled_from([1, 7, 40, 0.1]), stop=st.sampled_from(["first", "all"]))
def test_the_epoch_size_of_skewed_schedules_is_the_models(counted_shards, sizes, data, skew, stop):
    """The search's window (closed form, a line within 2K) against the model's total-by-total search."""
    schedule = data.draw(schedules(len(sizes)), label="schedule")
    schedule = [(start, [w * skew if p == 0 else w for p, w in enumerate(weights)]) for start, weights in schedule]
    manifests = written(counted_shards, [[size] for size in sizes])
    expected = model_phase_counts(sizes, schedule, stop=stop)
    if expected == REFUSED:
        one_line_refusal(lambda: scheduled_mix(manifests, schedule, stop=stop))
        return
    assert scheduled_mix(manifests, schedule, stop=stop).phase_counts() == expected


def test_a_one_phase_schedule_is_the_mix_of_its_weights(counted_shards):
    """Rule M7: the same samples, in the same order, and states that load into each other."""
    parts = [[3, 1, 4], [5, 2]]
    manifests = written(counted_shards, parts)
    for rank in range(2):
        plan = dict(seed=5, epoch=2, shuffle_buffer=3, rank=rank, world_size=2, equalize="pad", stop="all")
        plain = wdsprep.mix([{"location": m, "weight": w} for m, w in zip(manifests, [2, 1])], **plan)
        one = wdsprep.mix([{"location": m} for m in manifests], schedule=[(0, [2, 1])], **plan)
        assert [phased(s) for s in one] == [phased(s) for s in plain]
        assert [phased(s)[0] for s in one] == [None] * len(one)  # no __phase__ in a mix of one phase
        iterator = iter(plain)
        next(iterator)
        state = saved(plain)
        again = wdsprep.mix([{"location": m} for m in manifests], schedule=[(0, [2, 1])], **plan)
        again.load_state_dict(state)
        assert [phased(s) for s in again] == [phased(s) for s in plain][1:]


def test_weights_by_part_name_leave_the_parts_not_named_out(counted_shards):
    manifests = written(counted_shards, [[4, 3], [5, 2]])
    parts = [{"location": manifests[0], "name": "clean"}, {"location": manifests[1], "name": "noisy"}]
    by_name = wdsprep.mix(parts, schedule=[(0, {"clean": 1}), (0.5, {"noisy": 3, "clean": 1})], samples_per_epoch=12)
    by_list = wdsprep.mix(parts, schedule=[(0, [1, 0]), (0.5, [1, 3])], samples_per_epoch=12)
    assert by_name.phase_counts() == by_list.phase_counts() == model_phase_counts(
        [7, 7], [(0, [1, 0]), (0.5, [1, 3])], samples_per_epoch=12) == [[6, 0], [2, 4]]
    assert [phased(s) for s in by_name] == [phased(s) for s in by_list]


# ------------------------------------------------------------------------------ what each worker reads
@FAST
@given(parts=mix_parts, data=st.data(), stop=st.sampled_from(["first", "all"]),
       samples_per_epoch=st.one_of(st.none(), st.integers(1, 30)), seed=seeds, epoch=st.integers(0, 3),
       world=st.integers(1, 5), workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers)
def test_every_rank_and_worker_reads_what_the_model_says(counted_shards, parts, data, stop, samples_per_epoch, seed,
                                                         epoch, world, workers, equalize, buffer):
    """1-5 ranks, 1-4 workers, phases from fractions and sample positions, phases shorter than ranks x
    workers (positions 1 apart, samples_per_epoch of a few samples), weights 0 in some phases."""
    schedule = data.draw(schedules(len(parts), positions_below=samples_per_epoch), label="schedule")
    manifests = written(counted_shards, parts)
    plan = dict(world=world, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch, stop=stop,
                samples_per_epoch=samples_per_epoch)
    for rank in range(world):
        for worker in range(workers):
            expected = model_scheduled_worker(parts, schedule, workers=workers, worker=worker, rank=rank, **plan)
            got = real_scheduled_worker(manifests, schedule, workers=workers, worker=worker, rank=rank, **plan)
            assert got == expected, (rank, worker)


def test_phases_shorter_than_ranks_times_workers_are_padded_onto_every_rank(counted_shards):
    """Phases of 1, 2 and 3 samples over 3 ranks of 2 workers: with pad every rank gets a sample of
    each part a phase weighs (its own, or a repeat), some workers none; with drop the mix is refused."""
    parts, schedule = [[4, 3], [5]], [(0, [1, 0]), (1, [1, 1]), (3, [0, 1]), (6, [2, 1])]
    manifests = written(counted_shards, parts)
    plan = dict(world=3, equalize="pad", buffer=0, seed=3, epoch=1, samples_per_epoch=12)
    per_rank = []
    for rank in range(3):
        got = []
        for worker in range(2):
            expected = model_scheduled_worker(parts, schedule, workers=2, worker=worker, rank=rank, **plan)
            assert real_scheduled_worker(manifests, schedule, workers=2, worker=worker, rank=rank, **plan) == expected
            got += expected
        per_rank.append(collections.Counter((phase, name) for phase, name, _ in got))
    assert per_rank[0] == per_rank[1] == per_rank[2]
    assert per_rank[0][0, "0"] == 1 and per_rank[0][1, "0"] == 1 and per_rank[0][1, "1"] == 1
    message = one_line_refusal(lambda: scheduled_mix(manifests, schedule, world=3, equalize="drop", samples_per_epoch=12))
    assert "part 0: 1 sample(s) in phase 0 of the epoch for 3 ranks: equalize='drop' would leave it out" in message


# ------------------------------------------------------------------------------ proportions and equal ranks
def phase_runs(stream):
    """A worker's stream as {phase: [part names in order]} (each phase one contiguous run)."""
    runs = collections.defaultdict(list)
    seen = []
    for phase, name, _ in stream:
        if not seen or seen[-1] != phase:
            assert phase not in seen, "a phase came back after another"
            seen.append(phase)
        runs[phase].append(name)
    assert seen == sorted(seen)
    return runs


@FAST
@given(parts=mix_parts, data=st.data(), samples_per_epoch=st.integers(4, 40), seed=seeds, world=st.integers(1, 5),
       workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE), buffer=buffers)
def test_every_prefix_of_every_phase_holds_each_part_within_one_of_its_share(
        counted_shards, parts, data, samples_per_epoch, seed, world, workers, equalize, buffer):
    """Per worker and phase: |taken_p(t) - t * c_p / T| < 1 in every prefix of the phase (at the end of
    every block of the phase with a shuffle buffer); with equalize, worker k of every rank yields the
    same count of every part in every phase."""
    schedule = data.draw(schedules(len(parts), positions_below=samples_per_epoch), label="schedule")
    assume(len(schedule) > 1)
    manifests = written(counted_shards, parts)
    names = [str(p) for p in range(len(parts))]
    per_worker = collections.defaultdict(list)
    for rank in range(world):
        for worker in range(workers):
            got = real_scheduled_worker(manifests, schedule, workers=workers, worker=worker, world=world, rank=rank,
                                        equalize=equalize, buffer=buffer, seed=seed,
                                        samples_per_epoch=samples_per_epoch)
            if got == REFUSED:
                return
            runs = phase_runs(got)
            for phase, stream in runs.items():
                assert prefix_deviations(stream, names, buffer) < 1, (rank, worker, phase)
            per_worker[worker].append({phase: collections.Counter(stream) for phase, stream in runs.items()})
    if equalize is not None:
        for worker, tables in per_worker.items():
            assert all(table == tables[0] for table in tables), worker


# ------------------------------------------------------------------------------ through wdsprep.Loader
LOADER_PARTS = [[3, 1, 0, 2], [4], [2, 2]]  # 6 + 4 + 4 samples
LOADER_SCHEDULE = [(0, [1, 0, 2]), (0.3, [2, 1, 0]), (0.55, [0, 1, 1]), (0.8, [1, 1, 1])]
LOADER_EPOCH = 36  # phases of 10, 9, 9 and 8 samples (parts cycle)
BATCH = 3  # phase boundaries fall inside batches


def model_loader_epoch(epoch, *, workers, buffer, world=1, rank=0, equalize=None, seed=11,
                       parts=LOADER_PARTS, schedule=LOADER_SCHEDULE, batch=BATCH):
    streams = []
    for worker in range(max(1, workers)):
        items = model_scheduled_worker(parts, schedule, world=world, rank=rank, workers=max(1, workers),
                                       worker=worker, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch,
                                       samples_per_epoch=LOADER_EPOCH)
        streams.append([(phase, name, key, epoch) for phase, name, key in items])
    return [items for _, items in round_robin_batches(streams, batch)]


def collate(batch):
    return [(sample["__phase__"], sample["__part__"], sample["__key__"], int(sample["__epoch__"])) for sample in batch]


def make_loader(manifests, workers, buffer, *, world=1, rank=0, equalize=None, seed=11, epoch=None,
                schedule=LOADER_SCHEDULE):
    mix = wdsprep.mix([wdsprep.Part(m) for m in manifests], schedule=schedule, seed=seed, epoch=epoch,
                      samples_per_epoch=LOADER_EPOCH,
                      shuffle_buffer=buffer, equalize=equalize, rank=rank, world_size=world)
    return wdsprep.Loader(mix, batch_size=BATCH, num_workers=workers, collate_fn=collate)


def test_the_loaders_phase_boundaries_fall_inside_batches():
    """The case the Loader tests read: some batch holds samples of two phases."""
    batches = model_loader_epoch(1, workers=2, buffer=0, world=2, rank=1, equalize="pad")
    assert any(len({phase for phase, *_ in batch}) > 1 for batch in batches)


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("buffer", [0, 3])
def test_a_loader_state_saved_after_every_batch_resumes_exactly(counted_shards, workers, buffer):
    """Rank 1 of 2: the model's batches (phase boundaries inside batches), and a state saved before
    the first batch and after each (inside a phase, on a boundary, after the last) resumes to exactly
    the rest."""
    manifests = written(counted_shards, LOADER_PARTS)
    plan = dict(world=2, rank=1, equalize="pad", buffer=buffer)
    resumes_after_every_batch(lambda: make_loader(manifests, workers, epoch=1, **plan),
                              model_loader_epoch(1, workers=workers, **plan))


@pytest.mark.parametrize("workers", [0, 2])
def test_states_saved_across_two_epochs_resume_into_the_epoch_they_were_saved_in(counted_shards, workers):
    manifests = written(counted_shards, LOADER_PARTS)
    expected = [batch for epoch in range(2) for batch in model_loader_epoch(epoch, workers=workers, buffer=3)]
    resumes_across_epochs(lambda: make_loader(manifests, workers, 3), expected, 2)


@FAST
@given(parts=mix_parts, data=st.data(), stop=st.sampled_from(["first", "all"]), world=st.integers(1, 3),
       equalize=st.sampled_from(EQUALIZE), buffer=buffers, seed=st.integers(0, 5))
def test_a_resumed_mix_and_a_resumed_resumed_mix_give_exactly_the_rest(counted_shards, parts, data, stop, world,
                                                                       equalize, buffer, seed):
    schedule = data.draw(schedules(len(parts)), label="schedule")
    manifests = written(counted_shards, parts)
    rank = data.draw(st.integers(0, world - 1), label="rank")
    plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=1, stop=stop)
    expected = model_scheduled_worker(parts, schedule, **plan)
    assume(expected != REFUSED)
    resumed_twice(lambda: scheduled_mix(manifests, schedule, **plan), phased, expected, data)


# ------------------------------------------------------------------------------ elastic resume
def model_marked_worker(phases, counts, *, world, rank, workers, worker, equalize, buffer, seed, epoch):
    """(phase, part, (position in the phase's segment, padding?)) of one worker's stream."""
    out = []
    for k, segments in enumerate(phases):
        marked = []
        for items in segments:
            own = len(model_contiguous_run(items, world, rank))
            positions = model_rank(list(range(len(items))), world, rank, equalize)
            marked.append([(position, i >= own) for i, position in enumerate(positions)])
        streams = []
        for p, mine in enumerate(marked):
            run = model_contiguous_run(mine, workers, worker)
            streams.append(model_block_shuffle(run, model_part_buffer(buffer, counts[k], p),
                                               (seed, epoch, rank, worker, *part_key(p), *phase_key(k))))
        labels = model_schedule([len(s) for s in streams], buffer, (seed, epoch, rank, worker, *phase_key(k)))
        sources = [iter(s) for s in streams]
        out += [(k, p, next(sources[p])) for p in labels]
    return out


@pytest.mark.parametrize("old_world, new_world, new_workers", [(3, 2, 0), (3, 2, 3), (2, 3, 2)])
@pytest.mark.parametrize("equalize, buffer", [(None, 0), (None, 3), ("pad", 3)])
def test_elastic_resume_deals_exactly_what_the_old_ranks_had_not_delivered(counted_shards, old_world, new_world,
                                                                          new_workers, equalize, buffer):
    """Old ranks with 2 Loader workers each stop after 1, 3 (, 0) batches (inside phases, one past a
    boundary); the list of their states resumes on another number of ranks and workers: each phase's
    remainder (the model: the phase's segments less what the old workers' model streams delivered),
    dealt and interleaved afresh, phase after phase."""
    manifests = written(counted_shards, LOADER_PARTS)
    counts, phases = model_phase_epochs(LOADER_PARTS, LOADER_SCHEDULE, seed=11, epoch=1, samples_per_epoch=LOADER_EPOCH)
    delivered, old_batches, states = set(), [], []
    for rank, stop in zip(range(old_world), [1, 3, 0]):
        plan = dict(world=old_world, rank=rank, equalize=equalize, buffer=buffer, seed=11, epoch=1)
        marked = [model_marked_worker(phases, counts, workers=2, worker=w, **plan) for w in range(2)]
        delivered |= {(k, p, position) for _, batch in round_robin_batches(marked, BATCH)[:stop]
                      for k, p, (position, padding) in batch if not padding}
        loader = make_loader(manifests, 2, buffer, world=old_world, rank=rank, equalize=equalize, epoch=1)
        iterator = iter(loader)
        old_batches += take(iterator, stop)
        states.append(saved(loader))
        del iterator
    assert any(state["workers"][w].get("phase", 0) > 0 for state in states for w in state["workers"])
    rest = [[[item for position, item in enumerate(items) if (k, p, position) not in delivered]
             for p, items in enumerate(segments)] for k, segments in enumerate(phases)]
    new_batches = []
    for rank in range(new_world):
        streams = []
        for worker in range(max(1, new_workers)):
            streams.append([(k, str(p), key, 1) for k, segments in enumerate(rest) for p, key in model_phase_stream(
                segments, counts[k], k, world=new_world, rank=rank, workers=max(1, new_workers), worker=worker,
                equalize=equalize, buffer=buffer, seed=11, epoch=1)])
        new_batches += resumed_from(states, [batch for _, batch in round_robin_batches(streams, BATCH)], rank,
                                    lambda: make_loader(manifests, new_workers, buffer, world=new_world, rank=rank,
                                                        equalize=equalize))
    if equalize is None:  # the old run and the new one together: the epoch's samples, each exactly once
        everything = collections.Counter((k, str(p), key) for k, segments in enumerate(phases)
                                         for p, items in enumerate(segments) for key in items)
        together = collections.Counter((k, name, key) for batch in old_batches + new_batches
                                       for k, name, key, _ in batch)
        assert together == everything


# ------------------------------------------------------------------------------ states of another schedule
def refusal(load) -> str:
    with pytest.raises(wdsprep.ConfigError) as error:
        load()
    assert "\n" not in str(error.value)
    return str(error.value)


def a_state(manifests, **options):
    run = wdsprep.mix([{"location": m, "name": n} for m, n in zip(manifests, "ab")], seed=3, epoch=1,
                      samples_per_epoch=12, **options)
    take(iter(run), 3)
    return saved(run)


def mix_of(manifests, **options):
    return wdsprep.mix([{"location": m, "name": n} for m, n in zip(manifests, "ab")], seed=3, epoch=1,
                       samples_per_epoch=12, **options)


def test_a_state_of_another_schedule_is_refused_naming_the_difference(counted_shards):
    manifests = written(counted_shards, [[4, 3], [5, 2]])
    schedule = [(0, [1, 0]), (0.5, [0.3, 0.7])]
    state = a_state(manifests, schedule=schedule)
    assert state["mix"]["schedule"] == [[0, ["1", "0"]], ["1/2", ["5404319552844595/18014398509481984",
                                                                   "3152519739159347/4503599627370496"]]]
    cases = {
        "weights": ([(0, [1, 0]), (0.5, [0.4, 0.6])],
                    "state was saved with phase 1 weights ['0.3', '0.7'], this mix's phase 1 has ['0.4', '0.6']; "
                    "load_state_dict(state, reweight=True) finishes the saved epoch with the saved schedule"),
        "start": ([(0, [1, 0]), (0.6, [0.3, 0.7])], "state was saved with phase 1 from 0.5, this mix's phase 1 is from 0.6"),
        "position": ([(0, [1, 0]), (6, [0.3, 0.7])], "state was saved with phase 1 from 0.5, this mix's phase 1 is from 6"),
        "phases": ([(0, [1, 0]), (0.5, [0.3, 0.7]), (0.75, [1, 1])],
                   "state was saved with a schedule of 2 phases, this mix has 3"),
        "first weights": ([(0, [2, 0]), (0.5, [0.3, 0.7])],
                          "state was saved with phase 0 weights ['1', '0'], this mix's phase 0 has ['2', '0']"),
    }
    for name, (other, expected) in cases.items():
        assert expected in refusal(lambda: mix_of(manifests, schedule=other).load_state_dict(state)), name
    plain = mix_of(manifests)
    assert ("state was saved with a schedule of 2 phases, this mix has weights ['1', '1'] (no schedule); "
            "load_state_dict(state, reweight=True) finishes the saved epoch with the saved schedule") in refusal(
        lambda: plain.load_state_dict(state))
    weighted_state = a_state(manifests)
    assert ("state was saved with weights ['1', '1'] (no schedule), this mix has the schedule "
            "[(0, [1, 0]), (0.5, [0.3, 0.7])]") in refusal(
        lambda: mix_of(manifests, schedule=schedule).load_state_dict(weighted_state))
    assert "phase 0 weights ['1', '0'], this mix's phase 0 has ['2', '0']" in refusal(
        lambda: mix_of(manifests, schedule=[(0, [2, 0]), (0.5, [0.3, 0.7])]).load_state_dict([state]))
    state["mix"]["schedule"][1][1] = ["x", "1"]  # an edited state, loaded with reweight=True: its schedule is read
    assert "state's schedule [[0, ['1', '0']], ['1/2', ['x', '1']]] is not phases of 2 weights >= 0" in refusal(
        lambda: mix_of(manifests, schedule=schedule).load_state_dict(state, reweight=True))


@pytest.mark.parametrize("old, new", [
    ([(0, [1, 0]), (0.5, [1, 3])], [(0, [1, 1]), (4, [0, 1]), (8, [3, 1])]),  # one schedule for another
    (None, [(0, [1, 0]), (0.5, [1, 3])]),  # weights, then a schedule
    ([(0, [1, 0]), (0.5, [1, 3])], None),  # a schedule, then weights
])
def test_reweight_finishes_the_saved_epoch_with_its_schedule_and_uses_the_new_one_after(counted_shards, old, new):
    parts = [[4, 3], [5, 2]]
    manifests = written(counted_shards, parts)

    def model(schedule, epoch):
        return model_scheduled_worker(parts, schedule or [(0, [1, 1])], seed=3, epoch=epoch, samples_per_epoch=12,
                                      buffer=3)

    def make(schedule):
        return wdsprep.mix([{"location": m} for m in manifests], schedule=schedule, seed=3, samples_per_epoch=12,
                           shuffle_buffer=3)

    before, after = model(old, 0), model(new, 1)
    assert [key for *_, key in model(new, 0)] != [key for *_, key in before]
    run = make(old)
    head = [phased(s) for s in take(iter(run), 7)]  # past the first phase of `old`
    state = saved(run)
    assert "reweight=True" in refusal(lambda: make(new).load_state_dict(state))
    resumed = make(new)
    resumed.load_state_dict(state, reweight=True)
    middle = [phased(s) for s in take(iter(resumed), 2)]
    again = make(new)  # a state saved inside the reweighted epoch finishes it with the saved schedule too
    again.load_state_dict(saved(resumed), reweight=True)
    rest = [phased(s) for s in again]
    assert head + middle + rest == before
    assert [phased(s) for s in again] == after  # the next epoch: the new schedule


# ------------------------------------------------------------------------------ bad schedules
BAD_SCHEDULES = {  # the schedule, options, what the one line says
    "not a list": ("0.5", {}, "mix: schedule must be a non-empty list of (start, weights) phases, got '0.5'"),
    "empty": ([], {}, "mix: schedule must be a non-empty list"),
    "not a pair": ([(0, [1, 1], 3)], {}, "mix: schedule phase 0: a (start, weights) pair, got (0, [1, 1], 3)"),
    "first not 0": ([(0.1, [1, 1])], {}, "mix: schedule phase 0: the first phase starts at 0 (the epoch's start), got 0.1"),
    "start past 1": ([(0, [1, 1]), (1.5, [1, 0])], {}, "mix: schedule phase 1: start must be a sample position (a whole "
                     "number >= 0) or a fraction of the epoch (0 < start < 1), got 1.5"),
    "start text": ([(0, [1, 1]), ("10", [1, 0])], {}, "phase 1: start must be a sample position"),
    "start negative": ([(0, [1, 1]), (-3, [1, 0])], {}, "phase 1: start must be a sample position"),
    "start a boolean": ([(0, [1, 1]), (True, [1, 0])], {}, "phase 1: start must be a sample position"),
    "starts not increasing": ([(0, [1, 1]), (0.5, [1, 0]), (0.25, [0, 1])], {},
                              "mix: schedule phase 2: starts must increase, got 0.25 after 0.5"),
    "starts of two kinds": ([(0, [1, 1]), (0.5, [1, 0]), (10, [0, 1])], {},
                            "mix: schedule phase 2: starts are all sample positions (whole numbers) or all fractions"),
    "weights too few": ([(0, [1])], {}, "mix: schedule phase 0: 1 weights for 2 parts (0, 1)"),
    "weight negative": ([(0, [1, -1])], {}, "mix: schedule phase 0: the weight of part 1 (1)=-1: must be a number >= 0"),
    "weight nan": ([(0, [1, float("nan")])], {}, "the weight of part 1 (1)=nan: must be a number >= 0"),
    "weights all 0": ([(0, [1, 1]), (0.5, [0, 0])], {}, "mix: schedule phase 1: every weight is 0"),
    "a part never weighed": ([(0, [1, 0]), (0.5, [2, 0])], {},
                             "mix: part 1 (1): weight 0 in every phase of the schedule (it would never be read)"),
    "an unknown name": ([(0, {"0": 1, "2": 1})], {}, "mix: schedule phase 0: no part named '2' (parts: 0, 1)"),
    "weights text": ([(0, "1 1")], {}, "mix: schedule phase 0: weights must be a list of one number per part"),
    "epochized": ([(0, [1, 1])], {"mode": "epochized"}, "mix: schedule is for mode='weighted'"),
    "a part's own weight": ([(0, [1, 1])], {"weight": 2}, "mix: part 1: its weight is given by the schedule"),
    "a position past the epoch": ([(0, [1, 1]), (12, [1, 0])], {"samples_per_epoch": 12},
                                  "mix: schedule phase 1 starts at sample 12, past the epoch's end (samples_per_epoch=12)"),
    "too many phases": ([(k, [1, 1]) for k in range(1025)], {}, "mix: schedule has 1025 phases, more than the 1024"),
    "stop first runs out before a phase": ([(0, [1, 1]), (20, [1, 0])], {},
                                           "a part runs out before the last phase starts (sample 20)"),
    "stop all never covers": ([(0, [1, 1]), (2, [1, 0])], {"stop": "all"},
                              "part 1 has weight 0 in the last phase and the phases before it hold 1 of its 4 samples, "
                              "so no epoch holds it whole; give samples_per_epoch or stop='first'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEDULES))
def test_a_bad_schedule_is_one_config_error_line(counted_shards, case):
    schedule, options, expected = BAD_SCHEDULES[case]
    manifests = written(counted_shards, [[3, 2], [4]])
    weight = options.pop("weight", None)
    parts = [{"location": manifests[0]}, {"location": manifests[1], **({"weight": weight} if weight else {})}]
    message = one_line_refusal(lambda: wdsprep.mix(parts, schedule=schedule, **options))
    assert expected in message, message


# ------------------------------------------------------------------------------ bounded planning
def test_a_large_scheduled_epoch_plans_nothing_per_pass_before_len_and_its_first_samples(counted_shards, monkeypatch):
    """4*10^9 samples over two parts of 8 in three phases: len() makes no pass and no slot; the first
    samples of a worker that resumes deep in the last phase make the passes of its first chunk only,
    and are the model's samples at their positions."""
    parts = [[5, 3], [4, 4]]
    manifests = written(counted_shards, parts)
    schedule = [(0, [1, 0]), (0.25, [1, 1]), (0.5, [1, 3])]
    total = 4 * 10**9
    passes = budget(monkeypatch, mix_module, "pass_order", 8 * FIRST_CHUNK)
    slots = budget(monkeypatch, mix_module, "_slots", 1 << 16, weight=lambda counts, total, first, stop, taken: stop - first)

    def make():
        return wdsprep.mix([wdsprep.Part(m) for m in manifests], schedule=schedule, samples_per_epoch=total, seed=3,
                           epoch=2)

    mix = make()
    counts = model_phase_counts([8, 8], schedule, samples_per_epoch=total)
    assert mix.phase_counts() == counts == [[10**9, 0], [5 * 10**8, 5 * 10**8], [5 * 10**8, 15 * 10**8]]
    assert len(mix) == total and passes[0] == 0 and slots[0] == 0
    state = saved(mix)
    state["workers"]["0"] = {"phase": 2, "parts": [{"skip": 10000, "discard": 0, "delivered": 10000},
                                                    {"skip": 30000, "discard": 0, "delivered": 30000}]}
    resumed = make()
    resumed.load_state_dict(state)
    got = [phased(sample) for sample, _ in zip(iter(resumed), range(8))]
    # the phase's counts are 1:3, so its schedule repeats every 4 slots (5:15 every 20): slot 40,000 on
    # is the schedule from its start
    labels = model_schedule([5, 15])[:8]
    firsts = [counts[0][0] + counts[1][0] + 10000, counts[0][1] + counts[1][1] + 30000]
    expected = [iter(model_keys(parts[p], p, 3, 2, firsts[p], 8)) for p in range(2)]
    assert got == [(2, str(p), next(expected[p])) for p in labels]
    assert passes[0] <= 4 * FIRST_CHUNK and slots[0] <= 40000 + (1 << 14)  # the slots before its position are made again


def test_a_schedule_of_many_phases_makes_its_slots_once_not_every_pass(counted_shards, monkeypatch):
    """Twelve phases with counts of their own: the first epoch makes every slot of every phase's
    schedule once (rule M5, no closed form: about half a microsecond a slot), the next epochs (the
    same counts) make none, and read the model's samples. With room for less than an epoch's slots
    kept, the least recently used go: every slot is made again each epoch."""
    parts = [[6, 6], [5, 5], [4]]
    manifests = written(counted_shards, parts)
    schedule = [(20 * k, [1 + k, 18 - k, 1]) for k in range(12)]  # each phase's counts its weights
    monkeypatch.setattr(mix_module, "_labels", mix_module._KeptSchedules())
    slots = budget(monkeypatch, mix_module, "_slots", 10**6, weight=lambda counts, total, first, stop, taken: stop - first)
    mix = wdsprep.mix([wdsprep.Part(m) for m in manifests], schedule=schedule, samples_per_epoch=240, seed=1,
                      shuffle_buffer=4)
    assert len({tuple(phase) for phase in mix.phase_counts()}) == 12
    made = []
    for epoch in range(3):
        assert [phased(sample) for sample in mix] == model_scheduled_worker(
            parts, schedule, samples_per_epoch=240, seed=1, epoch=epoch, buffer=4)
        made.append(slots[0] - sum(made))
    assert made == [240, 0, 0]
    monkeypatch.setattr(mix_module, "KEPT_TOTAL", 120)
    monkeypatch.setattr(mix_module, "_labels", mix_module._KeptSchedules())
    for epoch in range(3, 5):
        assert [phased(sample) for sample in mix] == model_scheduled_worker(
            parts, schedule, samples_per_epoch=240, seed=1, epoch=epoch, buffer=4)
        made.append(slots[0] - sum(made))
    assert made[3:] == [240, 240]


def test_the_search_for_a_scheduled_epoch_tries_a_window_of_totals(counted_shards, monkeypatch):
    """stop='all' over parts of 800 and 3, the small one weighed only in the second half: the
    smallest epoch that holds both is found in a few tries (the model tries every total from 1); with
    weights 10^6:1 it lies among millions of totals: refused in one line naming a samples_per_epoch
    that holds every part."""
    manifests = written(counted_shards, [[400, 400], [3]])
    tried = budget(monkeypatch, mix_module, "_seats", 200)
    schedule = [(0, [3, 0]), (0.5, [1, 3])]
    mix = wdsprep.mix([wdsprep.Part(m) for m in manifests], schedule=schedule, stop="all")
    assert mix.phase_counts() == model_phase_counts([800, 3], schedule, stop="all")
    assert tried[0] <= 200
    skewed = [(0, [3, 0]), (0.5, [10**6, 1])]
    message = one_line_refusal(lambda: wdsprep.mix([wdsprep.Part(m) for m in manifests], schedule=skewed, stop="all"))
    assert "stop='all' with the schedule [(0, [3, 0]), (0.5, [1000000, 1])]" in message
    assert "more than the 100000 phase totals a plan tries" in message
    suggested = int(re.search(r"samples_per_epoch=(\d+) covers every part", message).group(1))
    sums = [sum(column) for column in zip(*model_phase_counts([800, 3], skewed, samples_per_epoch=suggested))]
    assert sums[0] >= 800 and sums[1] >= 3


@pytest.mark.parametrize("sizes, schedule, stop", [
    ([1, 9], [(0, [1, 0]), (0.1, [0.5, 3]), (Fraction(1, 3), [1, 0])], "all"),
    ([1, 6], [(0, [1, 0]), (0.1, [0, 1]), (0.25, [1, 0]), (0.6, [0, 1])], "all"),
    ([2, 1], [(0, [1, 1]), (Fraction(1, 3), [0, 1]), (0.9, [1, 0])], "first"),
])
def test_epochs_whose_counts_lie_more_than_one_off_the_line_are_the_models(counted_shards, sizes, schedule, stop):
    """Schedules whose epoch size lies where a part's count is more than one sample off its line
    A_p + B_p * S (each phase's length and apportionment off by less than one: up to 2 x phases, rule
    M7): a window of totals narrower than that misses them. Found by the property tests above against
    such a window (plant mix-schedule-window-too-narrow), which they catch only now and then."""
    manifests = written(counted_shards, [[size] for size in sizes])
    assert scheduled_mix(manifests, schedule, stop=stop).phase_counts() == model_phase_counts(sizes, schedule, stop=stop)


# ------------------------------------------------------------------------------ a part that expands its samples
def model_output_segments(items, outputs, counts):
    """A part's epoch items cut at cumulative outputs: phase k's segment ends with the item that
    brings the outputs to counts[0] + ... + counts[k] (rule 3 in outputs)."""
    segments, made, at = [], 0, 0
    for through in itertools.accumulate(counts):
        segment = []
        while at < len(items) and made < through:
            segment.append(items[at])
            made += outputs[items[at]]
            at += 1
        segments.append(segment)
    return segments


def test_an_expanding_part_is_cut_into_phases_by_its_outputs(counted_shards):
    """Part 0's stage makes 0-3 outputs of each sample (declared in outputs_per_sample); each phase
    takes the part's samples up to the one that brings its outputs to the phase's count; ranks and
    workers are dealt on outputs (equalize=None): the model of test_mix_config, per phase."""
    from .test_mix_config import EXPANDED, expand, manifest_order_outputs, model_weighted_run, outputs_of

    manifests = written(counted_shards, EXPANDED)
    schedule = [(0, [1, 2]), (0.4, [3, 1]), (0.7, [1, 1])]
    sizes = [sum(manifest_order_outputs(EXPANDED[0], 0)), sum(EXPANDED[1])]
    counts = model_phase_counts(sizes, schedule, stop="all")
    outputs = {key: outputs_of(key) for shard in part_keys(EXPANDED[0], 0) for key in shard}
    totals = [sum(column) for column in zip(*counts)]
    items = [model_part_epoch(part_keys(EXPANDED[p], p), totals[p], 7, 3, p, outputs if p == 0 else None)
             for p in range(2)]
    segments = [model_output_segments(items[0], outputs, [c[0] for c in counts]),
                model_segments(items[1], [c[1] for c in counts])]
    for rank in range(2):
        for worker in range(2):
            expected = []
            for k in range(len(schedule)):
                streams = []
                for p in range(2):
                    weights = [outputs[key] if p == 0 else 1 for key in segments[p][k]]
                    mine = model_weighted_run(segments[p][k], weights, 2, rank)
                    run = model_weighted_run(mine, [outputs[key] if p == 0 else 1 for key in mine], 2, worker)
                    streams.append([f"{key}/{j}" for key in run for j in range(outputs[key])] if p == 0 else run)
                labels = model_schedule([len(s) for s in streams], 0, ())
                sources = [iter(s) for s in streams]
                expected += [(k, str(p), next(sources[p])) for p in labels]
            with simulated_worker(worker, 2):
                mix = wdsprep.mix([wdsprep.Part(manifests[0], stages=(expand,),
                                                outputs_per_sample=manifest_order_outputs(EXPANDED[0], 0)),
                                   wdsprep.Part(manifests[1])], schedule=schedule, stop="all", seed=7, epoch=3,
                                  rank=rank, world_size=2, equalize=None)
                assert mix.phase_counts() == counts
                assert [phased(s) for s in mix] == expected, (rank, worker)


# ------------------------------------------------------------------------------ a mix file; wdsprep inspect
MIX_FILE = """
samples_per_epoch = 30
seed = 4
shuffle_buffer = 3

[[part]]
name = "clean"
location = "a/manifest.json"

[[part]]
name = "noisy"
location = "{b}"

[[phase]]
start = 0
weights = {{ clean = 1 }}

[[phase]]
start = 0.4
weights = {{ clean = 1, noisy = 3 }}

[[phase]]
start = 0.75
weights = [1, 1]
"""
FILE_SCHEDULE = [(0, [1, 0]), (0.4, [1, 3]), (0.75, [1, 1])]


@pytest.fixture
def mix_file(tmp_path, counted_shards):
    from .shardsets import write_counted_shards

    write_counted_shards(tmp_path / "a", [4, 3, 5], tag="a")
    other = counted_shards([5, 2], tag="b")
    path = tmp_path / "mix.toml"
    path.write_text(MIX_FILE.format(b=other))
    return path, [str(tmp_path / "a" / "manifest.json"), other]


def test_a_mix_file_with_phases_reads_what_the_same_mix_written_in_python_reads(mix_file):
    path, manifests = mix_file
    for rank in range(2):
        from_file = [phased(s) for s in wdsprep.mix(str(path), epoch=1, rank=rank, world_size=2)]
        in_python = wdsprep.mix([wdsprep.Part(manifests[0], name="clean"), wdsprep.Part(manifests[1], name="noisy")],
                                schedule=FILE_SCHEDULE, samples_per_epoch=30, seed=4, shuffle_buffer=3, epoch=1,
                                rank=rank, world_size=2)
        assert from_file == [phased(s) for s in in_python]
        expected = model_scheduled_worker([[4, 3, 5], [5, 2]], FILE_SCHEDULE, world=2, rank=rank, equalize="pad",
                                          buffer=3, seed=4, epoch=1, samples_per_epoch=30)
        assert [(phase, key) for phase, _, key in from_file] == [(phase, key) for phase, _, key in expected]


@pytest.mark.parametrize("top, table, expected", [
    ("", '[[phase]]\nstart = 0\nweights = [1, 1]\nweight = 2\n', "phase 0: unknown field(s) weight (start, weights)"),
    ("phase = 3\n", "", "a schedule is one [[phase]] table per phase (start, weights)"),
    ("", '[[phase]]\nstart = 0\nweights = { dirty = 1 }\n', "mix: schedule phase 0: no part named 'dirty' (parts: clean)"),
    ("", '[[phase]]\nstart = 0\nweights = [1]\n[[phase]]\nweights = [1]\n', "mix: schedule phase 1: start must be"),
])
def test_a_bad_phase_table_is_one_line_naming_the_file(tmp_path, counted_shards, top, table, expected):
    path = tmp_path / "bad.toml"
    path.write_text(top + f'[[part]]\nname = "clean"\nlocation = "{counted_shards([3, 2], tag="a")}"\n' + table)
    message = one_line_refusal(lambda: wdsprep.mix(str(path)))
    assert message.startswith(f"{path}: ") and expected in message, message


def test_inspect_shows_each_phases_counts_per_part_for_a_world_size(mix_file):
    """Each phase's row: its number, where it starts, its samples, then per part the epoch's count and
    (a rank's count) at the world size given, against the model's phase counts dealt with pad."""
    from wdsprep.conformance import run_cli

    path, _ = mix_file
    counts = model_phase_counts([12, 7], FILE_SCHEDULE, samples_per_epoch=30)
    assert counts == [[12, 0], [3, 7], [4, 4]]  # 0.75 of 30 is 22; 2.5 and 7.5: the tie to the lower part
    bounds = model_bounds(FILE_SCHEDULE, 30)
    for world in (1, 3):
        status, out, err = run_cli("inspect", path, "--world-size", str(world))
        assert status == 0, err
        assert "a schedule of 3 phases" in out
        lines = out.splitlines()
        rows = [line.split() for line in lines[lines.index(next(l for l in lines if l.startswith("phases:"))) + 2:]]
        assert len(rows) == 3
        for k, row in enumerate(rows):
            cells = []
            for n in counts[k]:
                per_rank = {len(model_rank(list(range(n)), world, rank, "pad")) for rank in range(world)}
                assert len(per_rank) == 1  # pad: every rank the same
                cells += [str(n), f"({per_rank.pop()})"]
            assert row[0] == str(k) and row[-5] == str(bounds[k + 1] - bounds[k]) and row[-4:] == cells, (world, row)
    bad = subprocess.run([sys.executable, "-m", "wdsprep", "inspect", str(path), "--world-size", "0"],
                         capture_output=True, text=True, timeout=SUBPROCESS)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "wdsprep: error:" in bad.stderr and "argument --world-size: '0': must be a whole number >= 1" in bad.stderr
