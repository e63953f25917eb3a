"""A user's collate through `wdsprep.Loader`: it sees only what it asked for, and resume stays exact.

A decoded sample carries `__key__` and its fields (a mix's also `__part__`); the reader's bookkeeping
(`__url__`, `__index__`, `__piece_start__`, `__epoch__`) only when `wdsprep.decode(bookkeeping=...)`
asks for it. Resume positions travel beside each batch in the Loader's own channel, never in the
samples, so a collate that keeps nothing but the keys still resumes exactly. Shards are made by
`wdsprep convert`; the reference is what `tarfile` lists in them, and the uninterrupted run (each
sample of the epoch once, in an order the resumed runs must continue).
"""
import json
import re
import tarfile
from pathlib import Path

import pytest
from torch.utils.data import default_collate

import wdsprep

from .valueshards import convert_value_shards


SAMPLES = 26
BATCH = 3
BOOKKEEPING = {"__url__", "__index__", "__piece_start__", "__epoch__"}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return convert_value_shards(tmp_path_factory.mktemp("collate"), SAMPLES, 16, "2KB")


def tar_keys(manifest) -> list[str]:
    """Every sample key in the shards, as `tarfile` reads them (the index member left out)."""
    keys = set()
    for shard in sorted(Path(manifest).parent.glob("*.tar")):
        with tarfile.open(shard) as archive:
            keys |= {member.name.partition(".")[0] for member in archive if not member.name.startswith("__")}
    return sorted(keys)


def names_and_keys(batch):
    """A user's collate that keeps only what it saw: the field names of every sample, and the keys."""
    return {"names": sorted(set().union(*batch)), "keys": [sample["__key__"] for sample in batch]}


def keys_only(batch):
    return [sample["__key__"] for sample in batch]


def _dataset(manifest, *, url=None, buffer=0, **decode):
    dataset = wdsprep.dataset(url or manifest, "train", seed=5, shuffle_buffer=buffer, equalize=None)
    return dataset.compose(wdsprep.decode(strip=True, **decode))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_collate_sees_the_key_and_fields_only(manifest, workers):
    batches = list(wdsprep.Loader(_dataset(manifest), batch_size=BATCH, num_workers=workers,
                                  collate_fn=names_and_keys))
    assert {name for batch in batches for name in batch["names"]} == {"__key__", "array", "meta"}
    assert sorted(key for batch in batches for key in batch["keys"]) == tar_keys(manifest)


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_default_collate_batches_no_bookkeeping(manifest, workers):
    batches = list(wdsprep.Loader(_dataset(manifest), batch_size=BATCH, num_workers=workers,
                                  collate_fn=default_collate))
    assert {frozenset(batch) for batch in batches} == {frozenset({"__key__", "array", "meta"})}
    for batch in batches:  # the values are the sample's own: array i holds i
        assert [int(row[0]) for row in batch["array"]] == [int(key[1:]) for key in batch["__key__"]]


def test_bookkeeping_comes_when_asked_for(manifest):
    asked = list(_dataset(manifest, bookkeeping=("__url__", "__epoch__")))
    assert {frozenset(sample) for sample in asked} == {frozenset({"__key__", "array", "meta", "__url__", "__epoch__"})}
    every = list(_dataset(manifest, bookkeeping=True))
    assert {frozenset(sample) - {"__key__", "array", "meta"} for sample in every} == {frozenset(BOOKKEEPING)}
    for sample in every:  # where it came from, checked against tarfile
        with tarfile.open(sample["__url__"]) as archive:
            names = [m.name.partition(".")[0] for m in archive if not m.name.startswith("__")]
        assert list(dict.fromkeys(names))[sample["__index__"]] == sample["__key__"]


def test_asking_for_a_name_that_is_not_bookkeeping_is_one_line():
    with pytest.raises(wdsprep.errors.ConfigError, match="decode\\(bookkeeping=\\.\\.\\.\\)='__label__': must be one of '__url__'"):
        wdsprep.decode(bookkeeping=("__label__",))


def test_a_mix_names_the_part_and_nothing_else(manifest):
    mix = wdsprep.mix([wdsprep.Part(manifest, "train", name="a", limit=10), wdsprep.Part(manifest, "train", name="b", fraction=0.5)],
                      seed=1, equalize=None).compose(wdsprep.decode(strip=True))
    batches = list(wdsprep.Loader(mix, batch_size=BATCH, num_workers=2, collate_fn=names_and_keys))
    assert {name for batch in batches for name in batch["names"]} == {"__key__", "__part__", "array", "meta"}


def _run(loader):
    return [list(batch) for batch in loader]


@pytest.mark.parametrize("collate", [keys_only, default_collate], ids=["keys_only", "default_collate"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_resume_with_a_user_collate_is_exact_from_every_batch(manifest, workers, collate):
    def make():
        return wdsprep.Loader(_dataset(manifest, buffer=4), batch_size=BATCH, num_workers=workers,
                              collate_fn=collate)

    def keys(batch):
        return list(batch["__key__"]) if isinstance(batch, dict) else list(batch)

    loader = make()
    whole, states = [], [loader.state_dict()]
    for batch in loader:
        whole.append(keys(batch))
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert sorted(key for batch in whole for key in batch) == tar_keys(manifest)  # each sample once
    for done, state in enumerate(states[:-1]):
        resumed = make()
        resumed.load_state_dict(state)
        assert [keys(batch) for batch in resumed] == whole[done:], (workers, done)


def test_resume_across_epochs_with_a_user_collate(manifest):
    def make():
        return wdsprep.Loader(_dataset(manifest, buffer=3), batch_size=BATCH, num_workers=2, collate_fn=keys_only)

    loader = make()
    epochs, states = [], []
    for epoch in range(3):
        batches = []
        for batch in loader:
            batches.append(batch)
            states.append((epoch, len(batches), json.loads(json.dumps(loader.state_dict()))))
        assert sorted(key for batch in batches for key in batch) == tar_keys(manifest)
        epochs.append(batches)
    assert epochs[0] != epochs[1]  # shards are permuted per epoch: resuming into the wrong one shows
    for epoch, done, state in states[:: 4]:
        resumed = make()
        resumed.load_state_dict(state)
        assert list(resumed) == epochs[epoch][done:], (epoch, done)  # empty after the epoch's last batch
        if epoch + 1 < len(epochs):  # then the next pass is the next epoch, whole
            assert list(resumed) == epochs[epoch + 1], (epoch, done)


def test_resume_over_http_with_default_collate(manifest):
    from wdsprep.testing import RangeHTTPServer

    with RangeHTTPServer(str(Path(manifest).parent)) as server:
        url = server.url_of("manifest.json")

        def make():
            return wdsprep.Loader(_dataset(manifest, url=url, buffer=2), batch_size=BATCH, num_workers=2,
                                  collate_fn=default_collate)

        loader = make()
        whole, states = [], []
        for batch in loader:
            assert set(batch) == {"__key__", "array", "meta"}
            whole.append(list(batch["__key__"]))
            states.append(loader.state_dict())
        assert sorted(key for batch in whole for key in batch) == tar_keys(manifest)
        for done in (1, len(whole) // 2, len(whole) - 1):
            resumed = make()
            resumed.load_state_dict(states[done - 1])
            assert [list(batch["__key__"]) for batch in resumed] == whole[done:], done


# ------------------------------------------------------------------------------ fields of different shapes
UNEVEN = re.compile(r"batch field 'array': shapes differ, (\(\d+,\)) in (?:part '(\w)' )?sample '(s\d+)' and "
                    r"(\(\d+,\)) in (?:part '(\w)' )?sample '(s\d+)': the Loader's default collate stacks a field of "
                    r"one shape; give collate_fn= \(one that pads, or that keeps a list\)")


def cut_in_part_b(sample):
    """Part 'b' keeps 3 of each array's 16 elements."""
    return {**sample, "array": sample["array"][:3]} if sample["__part__"] == "b" else sample


def cut_when_odd(sample):
    return {**sample, "array": sample["array"][:3]} if int(sample["__key__"][1:]) % 2 else sample


@pytest.mark.parametrize("workers", [0, 1])
def test_the_default_collate_names_the_field_the_shapes_and_the_parts(manifest, workers):
    """webdataset's collate fails a field of uneven arrays with a bare AssertionError; the Loader's
    default collate says it in one line: the field, two shapes, and the samples (and their parts)
    that have them, in the main process and from a worker alike."""
    mix = wdsprep.mix([wdsprep.Part(manifest, "train", name="a", limit=10),
                       wdsprep.Part(manifest, "train", name="b", fraction=0.5)], seed=1, equalize=None)
    loader = wdsprep.Loader(mix.compose(wdsprep.decode(strip=True)).map(cut_in_part_b), batch_size=8,
                            num_workers=workers)
    with pytest.raises(wdsprep.ConfigError) as raised:
        list(loader)
    found = UNEVEN.fullmatch(str(raised.value))
    assert found, str(raised.value)
    shapes = {found[2]: found[1], found[5]: found[4]}
    assert shapes == {"a": "(16,)", "b": "(3,)"}
    alone = wdsprep.Loader(_dataset(manifest).map(cut_when_odd), batch_size=4, num_workers=workers)
    with pytest.raises(wdsprep.ConfigError) as raised:
        list(alone)
    found = UNEVEN.fullmatch(str(raised.value))
    assert found and found[2] is None, str(raised.value)
    for shape, key in ((found[1], found[3]), (found[4], found[6])):
        assert shape == ("(3,)" if int(key[1:]) % 2 else "(16,)")  # what cut_when_odd made of that key
