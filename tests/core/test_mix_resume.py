"""Resuming a mix, against test_mix_oracle's reference model: a state saved at every stop point
(0-4 Loader workers, inside shuffle blocks, after an epoch's last batch, across epochs) resumes to
exactly the uninterrupted run; an elastic resume (3 -> 2 and 2 -> 3 ranks) deals exactly what the
old ranks had not delivered (the model: each part's epoch less the samples the old workers' model
streams delivered, dealt again); a state from another mix is refused in one line naming the
difference, and `reweight=True` finishes the saved epoch with the saved weights."""
import collections
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdsprep

from .test_mix_oracle import (
    BATCH,
    EQUALIZE,
    FAST,
    LOADER_PARTS,
    LOADER_WEIGHTS,
    REFUSED,
    TAGS,
    as_lists,
    buffers,
    make_loader,
    model_block_shuffle,
    model_contiguous_run,
    model_epochs,
    model_interleave,
    model_loader_epoch,
    model_part_buffer,
    model_part_streams,
    model_rank,
    model_worker,
    named,
    open_mix,
    part_key,
    round_robin_batches,
    written,
)
from .test_loader_oracle import batches_and_states, resumed_until
from .test_plan_oracle import simulated_worker

EPOCHS = 2


def saved(source):
    return json.loads(json.dumps(source.state_dict()))  # states travel as JSON


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


# ------------------------------------------------------------------------------ resume on the same world
def resumes_after_every_batch(make, expected):
    """A loader (`make()`) delivers the batches `expected`, and a state saved before its first batch and
    after each resumes a fresh one to exactly the rest."""
    got, states = batches_and_states(make(), saved)
    assert as_lists(got) == expected
    for done, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(state)
        assert as_lists(resumed) == expected[done:], done


def resumes_across_epochs(make, expected, epochs):
    """A loader counting epochs itself delivers `expected` over `epochs` epochs; states saved before
    the first batch, after each batch and after each epoch's loop ended, resumed by a fresh loader
    (whose own epoch is 0), deliver exactly the rest."""
    loader = make()
    got, states = [], [(0, saved(loader))]
    for _ in range(epochs):
        for batch in loader:
            got.append(batch)
            states.append((len(got), saved(loader)))
        states.append((len(got), saved(loader)))  # after the loop ended: the next epoch's start
    assert as_lists(got) == expected
    for done, state in states:
        rest = resumed_until(make, state, epochs)
        assert as_lists(rest) == expected[done:], (done, state["epoch"])


@pytest.mark.parametrize("buffer", [0, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("decoded", [False, True])
def test_a_loader_state_saved_after_every_batch_resumes_exactly(counted_shards, workers, buffer, decoded):
    """`decoded`: packed parts, each decoded in its reader: the mix takes their samples itself."""
    manifests = written(counted_shards, LOADER_PARTS, packed=decoded)
    plan = dict(world=2, rank=1, equalize="pad", buffer=buffer)
    resumes_after_every_batch(lambda: make_loader(manifests, workers, epoch=1, decoded=decoded, **plan),
                              model_loader_epoch(1, workers=workers, **plan))


@pytest.mark.parametrize("workers", [0, 3])
def test_states_saved_across_two_epochs_resume_into_the_epoch_they_were_saved_in(counted_shards, workers):
    """Each sample stamped with the model's epoch (`resumes_across_epochs`)."""
    manifests = written(counted_shards, LOADER_PARTS)
    expected = [batch for epoch in range(EPOCHS) for batch in model_loader_epoch(epoch, workers=workers, buffer=3)]
    resumes_across_epochs(lambda: make_loader(manifests, workers, 3), expected, EPOCHS)


@FAST
@given(parts=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3).filter(sum), min_size=1, max_size=3),
       stop=st.sampled_from(["first", "all"]), world=st.integers(1, 3), equalize=st.sampled_from(EQUALIZE),
       buffer=buffers, seed=st.integers(0, 5), decoded=st.booleans(), data=st.data())
def test_a_resumed_mix_and_a_resumed_resumed_mix_give_exactly_the_rest(counted_shards, parts, stop, world, equalize,
                                                                       buffer, seed, decoded, data):
    weights = [1, 2, 0.5][: len(parts)]
    manifests = written(counted_shards, parts, packed=decoded)
    rank = data.draw(st.integers(0, world - 1), label="rank")
    plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=1, stop=stop)
    expected = model_worker(parts, weights, **plan)
    if expected == REFUSED:
        with pytest.raises(wdsprep.ConfigError, match="equalize='drop' would leave it out"):
            open_mix(manifests, weights, **plan)
        return
    resumed_twice(lambda: open_mix(manifests, weights, decoded=decoded, **plan), named, expected, data)


def resumed_twice(make, name, expected, data):
    """A run (`make()`, its samples named by `name`) stopped after a drawn number of samples, resumed
    from its state, stopped again and resumed again: the three runs are the pieces of `expected`."""
    first = data.draw(st.integers(0, len(expected)), label="first stop")
    run = make()
    head = [name(s) for s in take(iter(run), first)]
    resumed = make()
    resumed.load_state_dict(saved(run))
    second = data.draw(st.integers(0, len(expected) - first), label="second stop")
    middle = [name(s) for s in take(iter(resumed), second)]
    again = make()
    again.load_state_dict(saved(resumed))
    tail = [name(s) for s in again]
    assert (head, middle, tail) == (expected[:first], expected[first : first + second], expected[first + second :])


# ------------------------------------------------------------------------------ elastic resume
def model_rank_marked(items, world, rank, equalize):
    """model_rank's list, each entry with whether it is the padding repeat (which delivers nothing)."""
    own = len(model_contiguous_run(items, world, rank))
    return [(item, i >= own) for i, item in enumerate(model_rank(items, world, rank, equalize))]


def model_worker_marked(epochs, *, world, rank, workers, worker, equalize, buffer, seed, epoch):
    """(part, (position in the part's epoch, padding?)) of one worker's stream over `epochs`."""
    streams = []
    sizes = [len(items) for items in epochs]
    for p, items in enumerate(epochs):
        mine = model_rank_marked(list(range(len(items))), world, rank, equalize)
        run = model_contiguous_run(mine, workers, worker)
        streams.append(model_block_shuffle(run, model_part_buffer(buffer, sizes, p),
                                           (seed, epoch, rank, worker, *part_key(p))))
    return model_interleave(streams, buffer, (seed, epoch, rank, worker))


def resumed_from(states, expected, rank, make):
    """The batches a fresh loader (`make()`) of `rank` delivers from the old ranks' `states`: `expected`."""
    loader = make()
    loader.load_state_dict(states)
    got = as_lists(loader)
    assert got == expected, rank
    return got


def model_remainder(epochs, delivered):
    """Each part's epoch less the positions delivered, in epoch order."""
    return [[item for position, item in enumerate(items) if (p, position) not in delivered]
            for p, items in enumerate(epochs)]


def old_loader(manifests, rank, world, workers, equalize, buffer, decoded=False):
    return make_loader(manifests, workers, buffer, world=world, rank=rank, equalize=equalize, epoch=1, decoded=decoded)


@pytest.mark.parametrize("old_world, new_world, new_workers", [(3, 2, 0), (3, 2, 3), (2, 3, 1), (2, 3, 2)])
@pytest.mark.parametrize("equalize, buffer, decoded", [(None, 0, False), (None, 3, False), ("pad", 3, False),
                                                       (None, 3, True), ("pad", 3, True)])
def test_elastic_resume_deals_exactly_what_the_old_ranks_had_not_delivered(counted_shards, old_world, new_world,
                                                                          new_workers, equalize, buffer, decoded):
    """Old ranks with 2 Loader workers each stop after 0, 1, 3 (, 2) batches; the list of their states
    resumes on another number of ranks and workers (`decoded`: packed parts decoded in their readers,
    whose samples the mix takes itself)."""
    manifests = written(counted_shards, LOADER_PARTS, packed=decoded)
    epochs = model_epochs(LOADER_PARTS, LOADER_WEIGHTS, seed=11, epoch=1, stop="all")
    delivered, old_batches, states = set(), [], []
    for rank, stop in zip(range(old_world), [1, 3, 0]):
        plan = dict(world=old_world, rank=rank, equalize=equalize, buffer=buffer, seed=11, epoch=1)
        marked = [model_worker_marked(epochs, workers=2, worker=w, **plan) for w in range(2)]
        delivered |= {(p, position) for _, batch in round_robin_batches(marked, BATCH)[:stop]
                      for p, (position, padding) in batch if not padding}
        loader = old_loader(manifests, rank, old_world, 2, equalize, buffer, decoded)
        iterator = iter(loader)
        old_batches += take(iterator, stop)
        states.append(saved(loader))
        del iterator
    rest = model_remainder(epochs, delivered)
    new_batches = []
    for rank in range(new_world):
        streams = []
        for worker in range(max(1, new_workers)):
            part_streams = model_part_streams(rest, world=new_world, rank=rank, workers=max(1, new_workers),
                                              worker=worker, equalize=equalize, buffer=buffer, seed=11, epoch=1,
                                              sizes=[len(items) for items in epochs])
            streams.append([(str(p), key, 1) for p, key in
                            model_interleave(part_streams, buffer, (11, 1, rank, worker))])
        new_batches += resumed_from(states, [batch for _, batch in round_robin_batches(streams, BATCH)], rank,
                                    lambda: make_loader(manifests, new_workers, buffer, world=new_world, rank=rank,
                                                        equalize=equalize, decoded=decoded))
    if equalize is None:  # the old run and the new one together: the epoch's samples, each exactly once
        everything = collections.Counter((str(p), key) for p, items in enumerate(epochs) for key in items)
        together = collections.Counter((name, key) for batch in old_batches + new_batches for name, key, _ in batch)
        assert together == everything


# ------------------------------------------------------------------------------ reweighting
def test_reweight_finishes_the_saved_epoch_with_the_saved_weights_and_uses_the_new_ones_after(counted_shards):
    manifests = written(counted_shards, LOADER_PARTS)
    old, new = [2, 1, 1.5], [1, 3, 1]
    plan = dict(seed=11, stop="all", buffer=3)
    before = [model_worker(LOADER_PARTS, old, epoch=e, **plan) for e in range(2)]
    after = [model_worker(LOADER_PARTS, new, epoch=e, **plan) for e in range(2)]
    assert before[0] != after[0] and before[1] != after[1]  # the weights change what an epoch holds
    run = open_mix(manifests, old, epoch=None, **plan)
    head = [named(s) for s in take(iter(run), 5)]
    state = saved(run)
    refused = open_mix(manifests, new, epoch=None, **plan)
    with pytest.raises(wdsprep.ConfigError, match=r"weights .*reweight=True") as error:
        refused.load_state_dict(state)
    assert "\n" not in str(error.value)
    resumed = open_mix(manifests, new, epoch=None, **plan)
    resumed.load_state_dict(state, reweight=True)
    middle = [named(s) for s in take(iter(resumed), 4)]
    again = open_mix(manifests, new, epoch=None, **plan)  # a state saved inside the reweighted epoch
    again.load_state_dict(saved(resumed), reweight=True)
    rest = [named(s) for s in again]
    assert head + middle + rest == before[0]
    assert [named(s) for s in again] == after[1]  # the next epoch: the new weights


# ------------------------------------------------------------------------------ foreign states
def a_state(parts, **options):
    run = wdsprep.mix(parts, seed=3, epoch=1, **options)
    take(iter(run), 3)
    return saved(run)


def refusal(load) -> str:
    with pytest.raises(wdsprep.ConfigError) as error:
        load()
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.fixture
def two_splits(tmp_path):
    """One directory whose manifest has a train and a valid split of the same shard counts."""
    from wdsprep.stream import load_manifest

    from .shardsets import write_counted_shards

    both = load_manifest(write_counted_shards(tmp_path, [4, 4], split="train", tag="t"))
    both.splits.update(load_manifest(write_counted_shards(tmp_path, [4, 4], split="valid", tag="t")).splits)
    (tmp_path / "manifest.json").write_bytes(both.dumps())
    return str(tmp_path / "manifest.json")


def test_a_state_of_a_mix_with_another_parts_data_is_refused(counted_shards):
    a, b, other = counted_shards([3, 3], tag="a"), counted_shards([4, 2], tag="b"), counted_shards([4, 2], tag="z")
    state = a_state([{"location": a}, {"location": b}])
    mix = wdsprep.mix([{"location": a}, {"location": other}], seed=3, epoch=1)
    assert "part '1': its data (shards) differs" in refusal(lambda: mix.load_state_dict(state))


def test_a_state_of_a_mix_with_another_split_is_refused(counted_shards, two_splits):
    a = counted_shards([3, 3], tag="a")
    state = a_state([{"location": a}, {"location": two_splits, "split": "train"}])
    mix = wdsprep.mix([{"location": a}, {"location": two_splits, "split": "valid"}], seed=3, epoch=1)
    assert "part '1': its split differs" in refusal(lambda: mix.load_state_dict(state))


def test_a_state_of_a_mix_with_another_selection_is_refused(counted_shards):
    a, b = counted_shards([3, 3], tag="a"), counted_shards([4, 2], tag="b")
    state = a_state([{"location": a}, {"location": b}])
    mix = wdsprep.mix([{"location": a}, {"location": b, "limit": 5}], seed=3, epoch=1)
    assert "part '1': its selection differs" in refusal(lambda: mix.load_state_dict(state))
    keyed = wdsprep.mix([{"location": a, "keys": ["as00x00", "as01x02"]}, {"location": b}], seed=3, epoch=1)
    assert "part '0': its selection differs" in refusal(lambda: keyed.load_state_dict(state))


def test_a_state_of_a_mix_with_other_weights_mode_or_stop_is_refused(counted_shards):
    a, b = counted_shards([3, 3], tag="a"), counted_shards([4, 2], tag="b")
    state = a_state([{"location": a, "weight": 1}, {"location": b, "weight": 2}])
    weights = wdsprep.mix([{"location": a, "weight": 1}, {"location": b, "weight": 3}], seed=3, epoch=1)
    assert "weights ['1', '2'], this mix has ['1', '3']" in refusal(lambda: weights.load_state_dict(state))
    epochized = wdsprep.mix([{"location": a}, {"location": b, "repeat": 2}], mode="epochized", seed=3, epoch=1)
    assert "mode='weighted', this mix has 'epochized'" in refusal(lambda: epochized.load_state_dict(state))
    everything = wdsprep.mix([{"location": a, "weight": 1}, {"location": b, "weight": 2}], stop="all", seed=3, epoch=1)
    assert "stop='first', this mix has 'all'" in refusal(lambda: everything.load_state_dict(state))
    fewer = wdsprep.mix([{"location": a}], seed=3, epoch=1)
    assert "parts ['0', '1'], this mix has ['0']" in refusal(lambda: fewer.load_state_dict(state))


def test_a_refused_state_says_the_weights_as_they_were_written(counted_shards):
    """A state keeps each weight as an exact fraction (0.3 is 5404319552844595/18014398509481984);
    the refusal writes it back as the number it is, and this mix's weights as the user gave them."""
    a, b = counted_shards([3, 3], tag="a"), counted_shards([4, 2], tag="b")
    state = a_state([{"location": a, "weight": 0.3}, {"location": b, "weight": 0.7}])
    assert state["mix"]["shares"] == ["5404319552844595/18014398509481984", "3152519739159347/4503599627370496"]
    other = wdsprep.mix([{"location": a, "weight": 0.4}, {"location": b, "weight": np.float32(0.6)}], seed=3, epoch=1)
    assert "state was saved with weights ['0.3', '0.7'], this mix has ['0.4', '0.6']; " in refusal(
        lambda: other.load_state_dict(state))
    thirds = a_state([{"location": a, "weight": Fraction(1, 3)}, {"location": b, "weight": 2}])
    assert "saved with weights ['1/3', '2'], this mix has ['0.4', '0.6']" in refusal(lambda: other.load_state_dict(thirds))
    thirds["mix"]["shares"] = ["1/0", "x"]  # an edited state, loaded with reweight=True: its weights are read
    assert "state's weights ['1/0', 'x'] are not 2 numbers > 0" in refusal(
        lambda: other.load_state_dict(thirds, reweight=True))


def test_a_single_dataset_state_and_a_mix_state_are_not_interchangeable(counted_shards):
    a = counted_shards([3, 3], tag="a")
    one = wdsprep.dataset(a, "train", seed=3, epoch=1)
    take(iter(one), 3)
    mix = wdsprep.mix([{"location": a}], seed=3, epoch=1)
    assert "not saved from a mix" in refusal(lambda: mix.load_state_dict(saved(one)))
    dataset = wdsprep.dataset(a, "train", seed=3, epoch=1)
    assert "saved from a mix" in refusal(lambda: dataset.load_state_dict(a_state([{"location": a}])))
    loader = wdsprep.Loader(wdsprep.dataset(a, "train", seed=3, epoch=1), batch_size=2)
    assert "saved from a mix" in refusal(lambda: loader.load_state_dict(a_state([{"location": a}])))


def test_a_one_part_mix_reads_what_the_dataset_reads(counted_shards):
    """M3: pass 0 of part 0 is the dataset's epoch, so a one-part mix is that dataset (plus `__part__`)."""
    a = counted_shards([3, 1, 4, 2], tag="a")
    for rank in range(2):
        plan = dict(seed=5, epoch=2, shuffle_buffer=3, rank=rank, world_size=2, equalize="pad")
        mixed = [named(s) for s in wdsprep.mix([{"location": a}], **plan)]
        alone = [("0", s["__key__"]) for s in wdsprep.dataset(a, "train", **plan)]
        assert mixed == alone


# ------------------------------------------------------------------------------ stages composed on the mix
def suffixed(source):
    """A one-to-one stage: each sample's key with its part appended."""
    for sample in source:
        yield {**sample, "__key__": f"{sample['__key__']}@{sample['__part__']}"}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_one_to_one_stage_composed_on_the_mix_runs_on_the_mixed_stream_and_resumes_exactly(counted_shards,
                                                                                               workers):
    manifests = written(counted_shards, LOADER_PARTS)
    expected = [[(name, f"{key}@{name}", epoch) for name, key, epoch in batch]
                for batch in model_loader_epoch(1, workers=workers, buffer=3)]

    def make():
        parts = [wdsprep.Part(m, weight=w) for m, w in zip(manifests, LOADER_WEIGHTS)]
        mix = wdsprep.mix(parts, seed=11, epoch=1, stop="all", shuffle_buffer=3, equalize=None)
        mix = mix.compose(wdsprep.decode(strip=True, bookkeeping=("__epoch__",))).compose(suffixed)
        return wdsprep.Loader(mix, batch_size=BATCH, num_workers=workers,
                              collate_fn=lambda batch: [(s["__part__"], s["__key__"], int(s["__epoch__"]))
                                                        for s in batch if isinstance(s["value"], np.ndarray)])

    got, states = batches_and_states(make(), saved)
    assert as_lists(got) == expected
    for done, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(state)
        assert as_lists(resumed) == expected[done:], done
