"""Selections (`keys=`, `select=`, `fraction=`, `limit=`) against an independent model.

The model, in plain Python over what the test knows without asking the code under test: the keys of
each shard read with `tarfile` (manifest order) and the field values the test wrote into the input
(tests/core/selectdata.py). It states the rules (docs/selecting.md) in the order they apply:
1. keys: the samples whose key is listed (in manifest order, whatever the order of the list);
2. select: the samples the expression keeps, a sample without a field holding its missing value
   (-1 for an integer field);
3. fraction f: of the n samples kept so far, exactly round(f * n) (Python's round: half to even),
   the first of a PCG64([seed & 0xFFFFFFFF, 0xF4AC]) permutation of their positions, in manifest order;
4. limit m: the first m kept, in manifest order;
5. the epoch deals the kept samples as test_plan_oracle's model deals a whole split: shards in the
   epoch's permutation (a shard keeping none contributes nothing), each shard's kept samples in order.

The real system runs through the public API over shards `wdsprep pipeline` made: ranks by `rank=`/
`world_size=`, DataLoader workers by WORKER/NUM_WORKERS or `wdsprep.Loader`; `wdsprep.MapDataset`
and `wdsprep.mix` parts take the same selections.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsprep

from .selectdata import FIELDS, field_of, shard_keys
from .test_mix_oracle import model_worker as model_mix_worker
from .test_plan_oracle import (model_block_shuffle, model_remainder, model_shard_order, model_worker_stream,
                               simulated_worker)

EQUALIZE = [None, "pad", "drop"]


# ------------------------------------------------------------------------------ the reference model
def model_kept(shards, values, *, keys=None, where=None, fraction=None, limit=None, seed=0):
    """Per shard, the keys a selection keeps (rules 1-4); `where(meta)`: the select expression."""
    flat = [(shard, key) for shard, shard_list in enumerate(shards) for key in shard_list]
    kept = [i for i, (_, key) in enumerate(flat)
            if (keys is None or key in keys) and (where is None or where(values[key]))]
    if fraction is not None:
        count = round(fraction * len(kept))
        order = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, 0xF4AC])).permutation(len(kept))
        kept = sorted(kept[int(i)] for i in order[:count])
    if limit is not None:
        kept = kept[:limit]
    per_shard = [[] for _ in shards]
    for i in kept:
        shard, key = flat[i]
        per_shard[shard].append(key)
    return per_shard


def model_items(per_shard, seed, epoch, shuffle=True):
    """The epoch's kept samples in dealing order (rule 5)."""
    return [key for shard in model_shard_order(len(per_shard), seed, epoch, shuffle) for key in per_shard[shard]]


def flat(per_shard):
    return [key for shard in per_shard for key in shard]


def f(name):
    """meta -> the value of index field `meta.<name>` as a selection sees it."""
    return lambda meta: field_of(meta, name)


KEYS = ["k031", "k002", "k017", "k018", "k019", "k044", "k002", "k050", "k009"]  # out of order, one twice
SELECTIONS = {  # name -> (the dataset's keywords, the model's keywords)
    "keys": (dict(keys=KEYS), dict(keys=set(KEYS))),
    "select": (dict(select="meta.label >= 3 and meta.tag != 'dog'"),
               dict(where=lambda m: f("label")(m) >= 3 and f("tag")(m) != "dog")),
    "select chained, not": (dict(select="1 <= meta.label < 4 or not meta.flag == True"),
                            dict(where=lambda m: 1 <= f("label")(m) < 4 or not f("flag")(m))),
    "select in, absent field": (dict(select="meta.tag in ('ému', 'owl') and meta.rare >= 10"),
                                dict(where=lambda m: f("tag")(m) in ("ému", "owl") and f("rare")(m) >= 10)),
    "select float": (dict(select="meta.score < 0.5 or meta.rare == -1"),
                     dict(where=lambda m: f("score")(m) < 0.5 or f("rare")(m) == -1)),
    "fraction": (dict(fraction=0.37), dict(fraction=0.37)),
    "limit": (dict(limit=13), dict(limit=13)),
    "all four": (dict(keys=[f"k{i:03d}" for i in range(3, 50)], select="meta.label != 0", fraction=0.6, limit=17),
                 dict(keys={f"k{i:03d}" for i in range(3, 50)}, where=lambda m: f("label")(m) != 0, fraction=0.6,
                      limit=17)),
}


# ------------------------------------------------------------------------------ the real system
@pytest.fixture(scope="module")
def labelled(labelled_conversion):
    """(manifest path, split -> per-shard keys (tarfile), split -> key -> meta)."""
    _, values, output = labelled_conversion
    return str(output / "manifest.json"), {s: shard_keys(output, s) for s in values}, values


def expected(labelled, name, seed, split="train"):
    _, shards, values = labelled
    return model_kept(shards[split], values[split], seed=seed, **SELECTIONS[name][1])


def open_rank(manifest, selection, *, world=1, rank=0, equalize=None, buffer=0, seed=0, epoch=0, shuffle=True,
              split="train"):
    return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_shards=shuffle, shuffle_buffer=buffer,
                           equalize=equalize, rank=rank, world_size=world, **selection)


def real_worker(manifest, selection, *, workers=1, worker=0, **plan):
    with simulated_worker(worker, workers):
        return [sample["__key__"] for sample in open_rank(manifest, selection, **plan)]


def take(iterator, n):
    return [next(iterator)["__key__"] for _ in range(n)]


# ------------------------------------------------------------------------------ what is kept
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_each_kind_of_selection_keeps_exactly_the_models_samples_in_manifest_order(labelled, name):
    manifest, shards, _ = labelled
    per_shard = expected(labelled, name, seed=5)
    kept = flat(per_shard)
    assert 0 < len(kept) < sum(map(len, shards["train"]))  # the case selects something, not everything
    assert sum(1 for shard in per_shard if shard) > 1
    dataset = open_rank(manifest, SELECTIONS[name][0], seed=5, shuffle=False)
    assert [sample["__key__"] for sample in dataset] == kept
    assert len(dataset) == len(kept)


def test_the_cases_cover_a_shard_keeping_none_and_the_fraction_rule_in_numbers(labelled):
    _, shards, _ = labelled
    assert any(not kept and whole for kept, whole in zip(expected(labelled, "keys", 0), shards["train"]))
    assert len(flat(expected(labelled, "fraction", 5))) == round(0.37 * 53) == 20
    assert len(flat(expected(labelled, "limit", 5))) == 13
    assert expected(labelled, "fraction", 5) != expected(labelled, "fraction", 6)  # another seed, another subset


@pytest.mark.parametrize("name", list(SELECTIONS))
def test_every_rank_of_1_to_5_and_worker_of_1_to_4_reads_the_models_share_each_once(labelled, name):
    """All ranks and workers of 1-5 ranks x 1-4 workers against the model, and the epoch as a whole:
    as dealt every kept sample once; pad: every rank ceil(n / W), a repeat only of its own first;
    drop: every rank floor(n / W), no sample twice."""
    manifest, _, _ = labelled
    seed, epoch = 3, 2
    items = model_items(expected(labelled, name, seed), seed, epoch)
    for world in range(1, 6):
        for workers in range(1, 5):
            equalize, buffer = EQUALIZE[(world + workers) % 3], [0, 3][workers % 2]
            delivered = []
            for rank in range(world):
                mine = []
                for worker in range(workers):
                    plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
                    want = model_worker_stream(items, workers=workers, worker=worker, **plan)
                    got = real_worker(manifest, SELECTIONS[name][0], workers=workers, worker=worker, **plan)
                    assert got == want, (world, workers, rank, worker)
                    mine += got
                delivered.append(mine)
            n = len(items)
            if equalize is None:
                assert sorted(k for rank in delivered for k in rank) == sorted(items)
            elif equalize == "pad":
                assert [len(rank) for rank in delivered] == [-(-n // world)] * world
                assert sorted(set(k for rank in delivered for k in rank)) == sorted(items)
            else:
                assert [len(rank) for rank in delivered] == [n // world] * world
                every = [k for rank in delivered for k in rank]
                assert len(every) == len(set(every)) and set(every) <= set(items)


BATCH = 2


def model_loader_epoch(items, *, workers, buffer, world, rank, equalize, seed, epoch):
    """Batches as a DataLoader delivers them: each worker batches its own stream, one batch per worker in turn."""
    streams = [model_worker_stream(items, world=world, rank=rank, workers=max(1, workers), worker=w,
                                   equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
               for w in range(max(1, workers))]
    batched = [[stream[i : i + BATCH] for i in range(0, len(stream), BATCH)] for stream in streams]
    return [b[turn] for turn in range(max(map(len, batched))) for b in batched if turn < len(b)]


def keys_of_batch(batch):
    return [sample["__key__"] for sample in batch]


def make_loader(manifest, selection, workers, **plan):
    dataset = open_rank(manifest, selection, **plan).compose(wdsprep.decode(strip=True))
    return wdsprep.Loader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=keys_of_batch)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_a_loader_delivers_the_models_batches_and_resumes_after_every_batch(labelled, workers):
    manifest, _, _ = labelled
    selection = SELECTIONS["all four"][0]
    plan = dict(world=2, rank=1, equalize="pad", buffer=3, seed=7, epoch=1)
    items = model_items(expected(labelled, "all four", 7), 7, 1)
    want = model_loader_epoch(items, workers=workers, **plan)
    loader = make_loader(manifest, selection, workers, **plan)
    got, states = [], [json.loads(json.dumps(loader.state_dict()))]
    for batch in loader:
        got.append(batch)
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert got == want
    for done, state in enumerate(states):
        resumed = make_loader(manifest, selection, workers, **plan)
        resumed.load_state_dict(state)
        assert list(resumed) == want[done:], done


# ------------------------------------------------------------------------------ resume
@pytest.mark.parametrize("name", ["select", "fraction", "all four"])
def test_a_selected_rank_resumes_exactly_from_every_stop(labelled, name):
    manifest, _, _ = labelled
    selection = SELECTIONS[name][0]
    for rank in range(2):
        plan = dict(world=2, rank=rank, equalize="pad", buffer=3, seed=9, epoch=4)
        want = model_worker_stream(model_items(expected(labelled, name, 9), 9, 4), workers=1, worker=0, **plan)
        for stop in range(len(want) + 1):
            run = open_rank(manifest, selection, **plan)
            head = take(iter(run), stop)
            resumed = open_rank(manifest, selection, **plan)
            resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))
            assert (head, [s["__key__"] for s in resumed]) == (want[:stop], want[stop:]), (rank, stop)


def check_elastic(labelled, name, *, seed, epoch, old_world, new_world, new_workers, equalize, buffer, stops):
    manifest, _, _ = labelled
    selection = SELECTIONS[name][0]
    items = model_items(expected(labelled, name, seed), seed, epoch)
    old = dict(world=old_world, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    states, delivered = [], []
    for rank in range(old_world):
        run = open_rank(manifest, selection, rank=rank, **old)
        length = len(model_worker_stream(items, rank=rank, workers=1, worker=0, **old))
        delivered += take(iter(run), min(stops[rank], length))
        states.append(json.loads(json.dumps(run.state_dict())))
    rest = model_remainder(items, old_world, [min(stops[r], len(model_worker_stream(items, rank=r, workers=1, worker=0, **old)))
                                              for r in range(old_world)],
                           equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    new = dict(world=new_world, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    for rank in range(new_world):
        for worker in range(new_workers):
            want = model_worker_stream(rest, rank=rank, workers=new_workers, worker=worker, **new)
            with simulated_worker(worker, new_workers):
                dataset = open_rank(manifest, selection, rank=rank, **new)
                dataset.load_state_dict(states)
                got = [sample["__key__"] for sample in dataset]
            assert got == want, (rank, worker)
            delivered += got
    if equalize is None:
        assert sorted(delivered) == sorted(items)  # every kept sample exactly once over both runs


@pytest.mark.parametrize("equalize", [None, "pad"])
@pytest.mark.parametrize("name", ["keys", "select chained, not", "all four"])
def test_an_elastic_resume_from_3_ranks_to_2_delivers_the_rest_of_the_selection_once(labelled, name, equalize):
    for stops in ([0, 0, 0], [1, 4, 2], [5, 0, 3], [99, 99, 1]):
        for new_workers in (1, 2):
            check_elastic(labelled, name, seed=2, epoch=3, old_world=3, new_world=2, new_workers=new_workers,
                          equalize=equalize, buffer=3, stops=stops)


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("other", [
    dict(select="meta.label >= 4 and meta.tag != 'dog'"),
    dict(),
    dict(select="meta.label >= 3 and meta.tag != 'dog'", limit=5),
    dict(select="meta.label >= 3 and meta.tag != 'dog'", fraction=0.5),
    dict(keys=["k001"]),
])
def test_a_state_saved_under_another_selection_is_refused_naming_it(labelled, other):
    manifest, _, _ = labelled
    run = open_rank(manifest, SELECTIONS["select"][0], world=2, equalize="pad")
    take(iter(run), 2)
    state = run.state_dict()
    with pytest.raises(wdsprep.ConfigError) as caught:
        open_rank(manifest, other, world=2, equalize="pad").load_state_dict(state)
    assert "selection" in str(caught.value) and "\n" not in str(caught.value)


def test_the_same_selection_written_otherwise_loads_the_state(labelled):
    """Keys in another order or given twice, an expression spaced otherwise: the same samples, the same state."""
    manifest, _, _ = labelled
    for first, second in ((dict(keys=KEYS), dict(keys=sorted(set(KEYS)))),
                          (dict(select="meta.label>=3 and meta.tag!='dog'"), SELECTIONS["select"][0])):
        run = open_rank(manifest, first)
        head = take(iter(run), 2)
        resumed = open_rank(manifest, second)
        resumed.load_state_dict(run.state_dict())
        assert head + [s["__key__"] for s in resumed] == [s["__key__"] for s in open_rank(manifest, first)]


def test_a_field_that_was_not_indexed_names_the_indexed_fields(labelled):
    manifest, _, _ = labelled
    with pytest.raises(wdsprep.ConfigError) as caught:
        open_rank(manifest, dict(select="meta.label == 1 and meta.sensor == 'x'"))
    assert str(caught.value) == (
        "select \"meta.label == 1 and meta.sensor == 'x'\": field 'meta.sensor' is not indexed in this split "
        f"(indexed fields: {', '.join(sorted(FIELDS))})")


@pytest.mark.parametrize("selection, message", [
    (dict(select="meta.label > 4"), "the selection (select 'meta.label > 4') keeps no sample of split 'train'"),
    (dict(select="meta.tag == \"__import__('os')\""), "keeps no sample of split 'train'"),
    (dict(fraction=0.005), "the selection (fraction 0.005) keeps no sample of split 'train'"),
    (dict(keys=[]), "keys: the list of keys is empty"),
    (dict(keys=["k001", "nope", "nada"]), "keys: 'nope' (and 1 more) not in split 'train' of "),
    (dict(keys=["k001"], split="valid", select="meta.label == 99"), "keeps no sample of split 'valid'"),
    (dict(limit=0), "limit=0: must be a whole number >= 1 (the first samples kept)"),
    (dict(fraction=1.5), "fraction=1.5: must be a number > 0 and <= 1 (the share of the samples kept)"),
])
def test_a_selection_that_cannot_be_kept_is_one_line(labelled, selection, message):
    manifest, _, _ = labelled
    selection = dict(selection)
    split = selection.pop("split", "train")
    with pytest.raises(wdsprep.ConfigError) as caught:
        open_rank(manifest, selection, split=split)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_key_of_another_split_is_not_in_this_one(labelled):
    manifest, shards, _ = labelled
    with pytest.raises(wdsprep.ConfigError, match=r"keys: 'k052' not in split 'valid'"):
        open_rank(manifest, dict(keys=["k001", "k052"]), split="valid")


EVIL = [
    "__import__('os').system('touch {marker}')",
    "meta.label == __import__('os').system('touch {marker}')",
    "open('{marker}', 'w') == 1",
    "meta.label == (lambda: open('{marker}', 'w'))()",
    "[open('{marker}', 'w') for x in (1,)] == 1",
    "meta.label == open('{marker}', 'w').close()",
    "meta.label + 1 == 3",
    "meta.label * 2 == 4",
    "meta.tag[0] == 'c'",
    "meta.label == (1).bit_length()",
    "'x'.join('ab') == meta.tag",
    "meta.label == meta.rare",
    "meta.label",
    "not meta.flag",
    "(x := 3) == meta.label",
    "f'{{meta.tag}}' == 'cat'",
    "meta.label == 1 if meta.flag else 2",
    "meta.label is 1",
    "meta.label == {{1: 2}}",
    "lambda: 1",
]


@pytest.mark.parametrize("text", EVIL)
def test_an_expression_that_is_not_a_plain_comparison_is_refused_and_never_run(labelled, tmp_path, text):
    manifest, _, _ = labelled
    marker = tmp_path / "ran"
    expression = text.format(marker=marker)
    for make in (lambda: open_rank(manifest, dict(select=expression)),
                 lambda: wdsprep.MapDataset(manifest, "train", select=expression),
                 lambda: wdsprep.mix([wdsprep.Part(manifest, "train", select=expression)])):
        with pytest.raises(wdsprep.ConfigError) as caught:
            make()
        assert f"select {expression!r}:" in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists()


def test_a_selection_is_evaluated_once_on_the_table_and_never_on_sample_data(labelled, monkeypatch):
    """The kept set is decided by the sample table: a dataset built while every shard is unreadable
    (renamed away) still knows its length; reading then names the missing shard."""
    manifest, _, _ = labelled
    directory = os.path.dirname(manifest)
    moved = []
    try:
        for name in sorted(os.listdir(directory)):
            if name.endswith(".tar"):
                os.rename(os.path.join(directory, name), os.path.join(directory, name + ".away"))
                moved.append(name)
        dataset = open_rank(manifest, SELECTIONS["all four"][0], seed=5)
        assert len(dataset) == len(flat(expected(labelled, "all four", 5)))
    finally:
        for name in moved:
            os.rename(os.path.join(directory, name + ".away"), os.path.join(directory, name))


# ------------------------------------------------------------------------------ properties
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
ALL_KEYS = [f"k{i:03d}" for i in range(53)]


@st.composite
def selections(draw):
    """A random selection (the dataset's keywords, the model's keywords) keeping at least one sample."""
    chosen = draw(st.sets(st.sampled_from(ALL_KEYS), min_size=1, max_size=53)) if draw(st.booleans()) else None
    threshold = draw(st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9])) if draw(st.booleans()) else None
    below = draw(st.booleans())
    fraction = draw(st.sampled_from([0.1, 0.3, 0.5, 0.77, 1.0])) if draw(st.booleans()) else None
    limit = draw(st.integers(1, 60)) if draw(st.booleans()) else None
    ours, model = {}, {}
    if chosen is not None:
        ours["keys"], model["keys"] = draw(st.permutations(sorted(chosen))), chosen
    if threshold is not None:
        ours["select"] = f"meta.score {'<' if below else '>='} {threshold}"
        model["where"] = (lambda m: m["score"] < threshold) if below else (lambda m: m["score"] >= threshold)
    if fraction is not None:
        ours["fraction"] = model["fraction"] = fraction
    if limit is not None:
        ours["limit"] = model["limit"] = limit
    return ours, model


@FAST
@given(selection=selections(), seed=st.one_of(st.integers(0, 3), st.integers(0, 2**40)), epoch=st.integers(0, 4),
       world=st.integers(1, 5), workers=st.integers(1, 4), equalize=st.sampled_from(EQUALIZE),
       buffer=st.sampled_from([0, 2, 5]), data=st.data())
def test_random_selections_count_and_order_as_the_model_says(labelled, selection, seed, epoch, world, workers,
                                                             equalize, buffer, data):
    manifest, shards, values = labelled
    ours, model = selection
    per_shard = model_kept(shards["train"], values["train"], seed=seed, **model)
    if not flat(per_shard):
        with pytest.raises(wdsprep.ConfigError, match="keeps no sample"):
            open_rank(manifest, ours, seed=seed)
        return
    items = model_items(per_shard, seed, epoch)
    rank = data.draw(st.integers(0, world - 1), label="rank")
    plan = dict(world=world, rank=rank, equalize=equalize, buffer=buffer, seed=seed, epoch=epoch)
    assert len(open_rank(manifest, ours, **plan)) == len(model_worker_stream(items, workers=1, worker=0, **plan))
    for worker in range(workers):
        want = model_worker_stream(items, workers=workers, worker=worker, **plan)
        assert real_worker(manifest, ours, workers=workers, worker=worker, **plan) == want, worker
    unshuffled = open_rank(manifest, ours, seed=seed, shuffle=False)
    assert [sample["__key__"] for sample in unshuffled] == flat(per_shard)


# ------------------------------------------------------------------------------ MapDataset and mix parts
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_a_map_dataset_holds_the_models_samples_in_manifest_order(labelled, name):
    manifest, shards, values = labelled
    kept = flat(expected(labelled, name, seed=4))
    ds = wdsprep.MapDataset(manifest, "train", seed=4, decode=False, **SELECTIONS[name][0])
    assert len(ds) == len(kept) and ds.keys() == kept
    assert [ds[i]["__key__"] for i in range(len(ds))] == kept
    assert [sample["__key__"] for sample in ds.__getitems__(list(range(len(ds)))[::-1])] == kept[::-1]
    assert ds.get(kept[-1])["__key__"] == kept[-1]
    left_out = next(key for key in values["train"] if key not in kept)
    with pytest.raises(KeyError) as caught:
        ds.get(left_out)
    assert caught.value.args[0].startswith(f"{left_out!r} is in split 'train' of ") and "not in the selection" in caught.value.args[0]
    with pytest.raises(IndexError, match=str(len(kept))):
        ds[len(kept)]


@pytest.mark.parametrize("buffer", [0, 3])
def test_mix_parts_with_selections_are_planned_on_their_kept_samples(labelled, buffer):
    """Part 0: train narrowed by select=, part 1: valid by fraction= (seeded by the mix's seed + 1,
    the part's index) and limit=; the mix model of test_mix_oracle over the kept keys of each shard."""
    manifest, shards, values = labelled
    seed = 6
    parts = [model_kept(shards["train"], values["train"], **SELECTIONS["select chained, not"][1]),
             model_kept(shards["valid"], values["valid"], fraction=0.7, limit=6, seed=seed + 1)]
    assert [len(flat(p)) for p in parts] == [len(flat(parts[0])), 6]
    for rank in range(2):
        for worker in range(2):
            plan = dict(world=2, rank=rank, workers=2, worker=worker, equalize="pad", buffer=buffer, seed=seed,
                        epoch=1, stop="all")
            want = model_mix_worker(parts, [1, 2], **plan)
            with simulated_worker(worker, 2):
                mix = wdsprep.mix([wdsprep.Part(manifest, "train", **SELECTIONS["select chained, not"][0]),
                                   wdsprep.Part(manifest, "valid", weight=2, fraction=0.7, limit=6)],
                                  seed=seed, epoch=1, stop="all", shuffle_buffer=buffer, rank=rank, world_size=2,
                                  equalize="pad")
                assert [(s["__part__"], s["__key__"]) for s in mix] == want, (rank, worker)


def test_the_model_block_shuffle_is_the_plan_oracles(labelled):
    """The dealing model is test_plan_oracle's own (imported, not copied): a sanity check of the import."""
    assert model_block_shuffle(list("abcdef"), 3, 1, 0, 0, 0) != list("abcdef")
