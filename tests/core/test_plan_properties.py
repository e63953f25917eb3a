"""The epoch plan at sample granularity, against a reference model written here from the rules in
stream/planning/plan.py's docstring (lists of (shard, index) samples, no pieces, no bisect)."""
import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsprep.errors import ConfigError
from wdsprep.stream.planning.plan import Level, epoch_sequence, keyed, rank_share, remainder, worker_run


# -- the reference model
def ref_global(counts, seed, epoch, shuffle):
    order = list(range(len(counts)))
    if shuffle:
        order = list(np.random.Generator(np.random.PCG64([seed, epoch, 0x5EED])).permutation(len(counts)))
    return [(int(s), i) for s in order for i in range(counts[s])]


def ref_cut(items, parts, index):
    base, extra = divmod(len(items), parts)
    start = index * base + min(index, extra)
    return items[start : start + base + (1 if index < extra else 0)]


def ref_rank(samples, rank, world, equalize):
    """(the rank's list, how many of it are its own samples)."""
    own = ref_cut(samples, world, rank)
    n = len(samples)
    base, extra = divmod(n, world)
    if equalize == "pad" and extra and len(own) == base:
        return own + ([own[0]] if own else [samples[rank % n]]), len(own)
    if equalize == "drop" and extra and len(own) == base + 1:
        return own[:-1], len(own) - 1
    return own, len(own)


def ref_stream(samples, rank, world, worker, workers, equalize, buffer, seed, epoch):
    """A worker's stream in delivery order, each entry (sample, is_padding)."""
    mine, own = ref_rank(samples, rank, world, equalize)
    tagged = [(s, i >= own) for i, s in enumerate(mine)]
    run = ref_cut(tagged, workers, worker)
    if buffer <= 1:
        return run
    out = []
    for b in range(0, len(run), buffer):
        block = run[b : b + buffer]
        order = np.random.Generator(np.random.PCG64([seed, epoch, rank, worker, b // buffer])).permutation(len(block))
        out += [block[i] for i in order]
    return out


def discarded(sequence):
    """A sequence's partly delivered samples as (shard, index) -> outputs (one pass: cycle 0)."""
    assert all(cycle == 0 for cycle, _, _ in sequence.discards)
    return {(shard, index): n for (_, shard, index), n in sequence.discards.items()}


def worker_pieces(pieces, *, worker, num_workers):
    """A rank's list cut into a worker's run (rule 5), as the worker plan cuts it."""
    return pieces.slice(*worker_run(len(pieces), worker, num_workers))


def flat(pieces):
    return [(p.shard, i) for p in pieces for i in range(p.start, p.stop)]


counts_strategy = st.one_of(
    st.lists(st.integers(0, 12), min_size=0, max_size=12),
    # one huge shard among tiny ones
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.integers(40, 200), st.integers(0, 8)).map(
        lambda t: t[0][: t[2]] + [t[1]] + t[0][t[2] :]
    ),
)


@settings(max_examples=300, deadline=None)
@given(counts=counts_strategy, world=st.integers(1, 8), workers=st.integers(0, 4), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 50), shuffle=st.booleans(), equalize=st.sampled_from([None, "pad", "drop"]))
def test_deal_matches_reference_and_is_balanced(counts, world, workers, seed, epoch, shuffle, equalize):
    logical = max(1, workers)  # num_workers=0 reads in the main process: one stream
    g = ref_global(counts, seed, epoch, shuffle)
    sequence = epoch_sequence(counts, seed, epoch, shuffle)
    per_rank, undealt = [], []
    for rank in range(world):
        pieces, _, _ = rank_share(sequence, rank, world, equalize)
        got = [s for w in range(logical) for s in flat(worker_pieces(pieces, worker=w, num_workers=logical))]
        expected, _ = ref_rank(g, rank, world, equalize)
        assert got == expected
        per_rank.append(got)
        undealt.append(flat(rank_share(sequence, rank, world, None)[0]))
    # before equalizing: per-rank counts differ by at most one, and the ranks partition the epoch
    assert max(map(len, undealt)) - min(map(len, undealt)) <= 1
    assert [s for r in undealt for s in r] == g
    used = collections.Counter(s for r in per_rank for s in r)
    if equalize == "pad":
        assert len({len(r) for r in per_rank}) == 1
        assert set(used) == set(g)
        for r, mine in zip(undealt, per_rank):
            assert len(mine) - len(r) <= 1  # at most one repeat per rank
    elif equalize == "drop":
        assert len({len(r) for r in per_rank}) == 1
        assert all(c == 1 for c in used.values()) and len(g) - len(used) <= world - 1
    else:
        assert sorted(used.elements()) == sorted(g)
    # per-worker counts equal across ranks (equal batch counts when each worker batches its own stream)
    if equalize is not None:
        for w in range(logical):
            sizes = {sum(p.samples for p in worker_pieces(rank_share(sequence, r, world, equalize)[0], worker=w, num_workers=logical)) for r in range(world)}
            assert len(sizes) == 1


def _interrupt(samples, world, workers, equalize, buffer, seed, epoch, draw):
    """Stop every worker of a pass at a random point; returns (level, delivered samples, partial ones)."""
    positions, delivered, partial = {}, [], {}
    for rank in range(world):
        for worker in range(workers):
            stream = ref_stream(samples, rank, world, worker, workers, equalize, buffer, seed, epoch)
            skip = draw(st.one_of(st.just(len(stream)), st.integers(0, len(stream))))  # finished workers too
            discard = draw(st.integers(0, 2)) if skip < len(stream) else 0
            positions[(rank, worker)] = (skip, discard)
            delivered += [s for s, pad in stream[:skip] if not pad]
            if discard and not stream[skip][1]:
                partial[stream[skip][0]] = discard
    return Level(world, workers, positions), delivered, partial


@settings(max_examples=600, deadline=None)
@given(counts=counts_strategy, world=st.integers(1, 8), workers=st.integers(1, 3), new_world=st.integers(1, 5),
       new_workers=st.integers(1, 3), buffer=st.sampled_from([0, 3]), equalize=st.sampled_from(["pad", "pad", None, "drop"]),
       seed=st.integers(0, 1000), data=st.data())
def test_elastic_remainder_delivers_the_rest_exactly_once(counts, world, workers, new_world, new_workers, buffer, equalize, seed, data):
    epoch = 3
    g = ref_global(counts, seed, epoch, True)
    level, delivered, partial = _interrupt(g, world, workers, equalize, buffer, seed, epoch, data.draw)
    rest = remainder(epoch_sequence(counts, seed, epoch, True), level, seed=seed, epoch=epoch, shuffle_buffer=buffer, equalize=equalize)
    # the remainder: every sample not delivered, in G order, carrying the partly delivered outputs
    assert flat(rest.pieces) == [s for s in g if s not in set(delivered)]
    assert discarded(rest) == partial
    # dealt to the new world: with pad or None every remaining sample is read once (padding apart)
    again = []
    for rank in range(new_world):
        mine, own = ref_rank(flat(rest.pieces), rank, new_world, equalize)
        pieces, _, got_own = rank_share(rest, rank, new_world, equalize)
        assert flat(pieces) == mine and got_own == own
        again += [s for w in range(new_workers) for s, pad in ref_stream(flat(rest.pieces), rank, new_world, w, new_workers, equalize, buffer, seed, epoch) if not pad]
    if equalize != "drop":
        assert sorted(delivered + again) == sorted(g)


def test_second_interruption_resumes_from_the_first_remainder():
    counts, seed, epoch = [5, 1, 9, 0, 4], 2, 1
    g = ref_global(counts, seed, epoch, True)
    first = Level(3, 2, {(0, 0): (2, 0), (1, 1): (1, 1), (2, 0): (3, 0)})
    rest = remainder(epoch_sequence(counts, seed, epoch, True), first, seed=seed, epoch=epoch, shuffle_buffer=0, equalize="pad")
    second = Level(2, 1, {(0, 0): (4, 0), (1, 0): (2, 0)})
    rest2 = remainder(rest, second, seed=seed, epoch=epoch, shuffle_buffer=0, equalize="pad")
    # hand-worked: G has 19 samples; ranks 7/6/6 (+1 pad), workers 4/3, 4/3, 4/3 -> first pass delivered
    # rank0 w0: G[0:2], rank1 w1: G[11:12] (then G[12] partly), rank2 w0: G[13:16]
    r1 = [s for i, s in enumerate(g) if not (i < 2 or i == 11 or 13 <= i < 16)]
    assert flat(rest.pieces) == r1 and discarded(rest) == {g[12]: 1}
    # second pass over the 13 left: ranks 7/6 (+1 pad): rank0 read r1[0:4], rank1 r1[7:9]; g[12] is r1[9]
    assert flat(rest2.pieces) == r1[4:7] + r1[9:]
    assert discarded(rest2) == {g[12]: 1}


def test_a_delivered_padding_repeat_delivers_nothing_new():
    # 4 samples on 3 ranks: [G0 G1] [G2 +G2] [G3 +G3]; rank 1 delivered everything, its repeat included
    g = ref_global([4], 0, 0, False)
    level = Level(3, 1, {(1, 0): (2, 0)})
    rest = remainder(epoch_sequence([4], 0, 0, False), level, seed=0, epoch=0, shuffle_buffer=0, equalize="pad")
    assert flat(rest.pieces) == [g[0], g[1], g[3]]


def test_bad_equalize_and_rank_are_refused():
    sequence = epoch_sequence([3, 4], 0, 0, True)
    with pytest.raises(ConfigError, match="equalize"):
        rank_share(sequence, 0, 2, "repeat")
    with pytest.raises(ConfigError, match=r"rank=2: must be a whole number >= 0 \(below world_size=2; at most 1\)"):
        rank_share(sequence, 2, 2, None)


@settings(max_examples=200, deadline=None)
@given(key=st.lists(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 2**70), st.sampled_from([0, 2**32 - 1, 2**32])),
                    min_size=1, max_size=9), size=st.integers(1, 40))
def test_a_keyed_generator_is_numpys_generator_of_the_same_key(key, size):
    """Every shuffle of the plan (rule 6's blocks, M3's passes, M5's slots) is keyed by a list of ints:
    `keyed` makes numpy's own generator of that list, only faster, for keys of small and large ints."""
    reference = np.random.Generator(np.random.PCG64(key))
    assert keyed(key).permutation(size).tolist() == reference.permutation(size).tolist()
    numpy_ints = tuple(np.int64(v) for v in key if v < 2**63)  # a seed or epoch given as a numpy int
    if numpy_ints:
        assert keyed(numpy_ints).random() == np.random.Generator(np.random.PCG64(list(numpy_ints))).random()
