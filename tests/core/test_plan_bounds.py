"""Planning is bounded: a mix's epoch size, an epoch of 10^7 to 4*10^9 samples, a manifest of many
splits and the read-ahead's connections are planned in a bounded number of steps, or refused in one
`ConfigError` line naming the value and the limit.

Steps are counted, never timed: the planner's inner functions are wrapped by a counter that fails the
test as soon as it passes its budget (so code that would search for ever fails at once): totals of
the epoch-size search tried (`apportion`, `_seats`), passes over a part made (`pass_order`), slots of
a worker's schedule made (`_slots`), Python calls per split of a manifest (`sys.setprofile`). What a
bounded plan yields is checked against the reference models of test_mix_oracle and test_plan_oracle
at the positions read (a pass's shard order, the schedule's first slots), written here for one pass
so that an epoch of 10^9 samples is never listed.
"""
import json
import math
import re
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdsprep
import wdsprep.stream.mix as mix_module
from wdsprep.stream import load_manifest
from wdsprep.stream.worker import FIRST_CHUNK

from .shardsets import write_counted_shards
from .test_mix_oracle import FAST, TAGS, model_apportion, model_epoch_counts, model_pass_order, model_schedule, written
from .test_plan_oracle import simulated_worker


class OverBudget(Exception):
    """A planner function was called past its budget (raised inside the planner: the test fails)."""


def budget(monkeypatch, module, name, limit, weight=lambda *args: 1):
    """Wrap `module.name` so that its calls (each counted as `weight(*args)` steps) fail past `limit`;
    returns the live count ([steps]). A name the module lacks (older code) is left alone."""
    steps = [0]
    original = getattr(module, name, None)
    if original is None:
        return steps

    def counted(*args, **kwargs):
        steps[0] += weight(*args)
        if steps[0] > limit:
            raise OverBudget(f"{name}: more than {limit} steps")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return steps


def one_line_refusal(make) -> str:
    with pytest.raises(wdsprep.ConfigError) as error:
        make()
    assert "\n" not in str(error.value)
    return str(error.value)


# ------------------------------------------------------------------------------ the epoch size (rule M2)
def two_part_counts(sizes, weights, stop):
    """Rule M2 for two parts, written independently: with two parts the largest remainder is the
    larger of two remainders that sum to one, so part 1 gets floor(quota) + 1 exactly when its
    remainder is above 1/2 (at 1/2 the tie goes to part 0). Its count never falls as S grows, so
    the smallest S that covers both sizes (stop="all") is found by bisection."""
    share = Fraction(weights[1]) / (Fraction(weights[0]) + Fraction(weights[1]))

    def counts(total):
        quota = total * share
        second = math.floor(quota) + (1 if quota - math.floor(quota) > Fraction(1, 2) else 0)
        return [total - second, second]

    assert stop == "all"
    low, high = 0, 1
    while not all(n >= size for n, size in zip(counts(high), sizes)):
        high *= 2
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if not all(n >= s for n, s in zip(counts(middle), sizes)) else (low, middle)
    return counts(low)


def test_the_two_part_rule_of_this_test_is_the_models():
    for sizes in ([8, 1], [5, 3], [9, 6], [2, 7]):
        for weights in ([7, 1], [2, 1], [1, 3], [0.3, 0.7], [1, 1]):
            assert two_part_counts(sizes, weights, "all") == model_epoch_counts(sizes, weights, stop="all")


def test_weights_a_billion_to_one_with_stop_all_try_a_few_totals(counted_shards, monkeypatch):
    """1e9:1 over parts of 8 and 1 samples: the smallest epoch that holds the small part whole has
    500000001 samples; found in a handful of tries (the search over totals was one by one)."""
    manifests = [counted_shards([5, 3], tag="a"), counted_shards([1], tag="b")]
    tried = [budget(monkeypatch, mix_module, name, 10) for name in ("apportion", "_seats")]
    mix = wdsprep.mix([wdsprep.Part(manifests[0], weight=1e9), wdsprep.Part(manifests[1], weight=1)], stop="all")
    expected = two_part_counts([8, 1], [1e9, 1], "all")
    assert expected == [500000000, 1]
    assert mix.epoch_counts() == expected
    assert tried[0][0] + tried[1][0] <= 10
    assert len(mix) == sum(expected)  # the plan is lazy: 62.5 million passes over part 0 are never made


def test_a_search_over_too_many_totals_is_refused_in_one_line_naming_a_total_that_holds(counted_shards, monkeypatch):
    """Three parts 10^6:1:1: the smallest epoch holding every part lies among ~333,000 totals (a
    remainder between 1/3 and 2/3 decides), past the 100,000 a plan tries: refused before trying any,
    naming a samples_per_epoch that holds every part."""
    manifests = written(counted_shards, [[5, 3], [1], [2]])
    tried = [budget(monkeypatch, mix_module, name, 1000) for name in ("apportion", "_seats")]
    weights = [10**6, 1, 1]
    message = one_line_refusal(lambda: wdsprep.mix([wdsprep.Part(m, weight=w) for m, w in zip(manifests, weights)],
                                                   stop="all"))
    assert "stop='all' with weights ['1000000', '1', '1']" in message
    assert "more than the 100000 a plan tries" in message
    assert tried[0][0] + tried[1][0] == 0
    suggested = int(re.search(r"samples_per_epoch=(\d+) covers every part", message).group(1))
    assert all(n >= size for n, size in zip(model_apportion(suggested, weights), [8, 1, 2]))


@FAST
@given(sizes=st.lists(st.integers(1, 9), min_size=2, max_size=4),
       weights=st.lists(st.sampled_from([1, 2, 3, 7, 0.3, 0.25, 40, 100, 0.1]), min_size=4, max_size=4),
       stop=st.sampled_from(["first", "all"]))
def test_the_epoch_size_of_skewed_weights_is_the_models(counted_shards, sizes, weights, stop):
    """The closed-form window of the search against the model's total-by-total search, with weights
    up to 1000:1 (the model tries every total from 0)."""
    weights = weights[: len(sizes)]
    manifests = written(counted_shards, [[size] for size in sizes])
    mix = wdsprep.mix([wdsprep.Part(m, weight=w) for m, w in zip(manifests, weights)], stop=stop)
    assert mix.epoch_counts() == model_epoch_counts(sizes, weights, stop=stop)


# ------------------------------------------------------------------------------ large epochs, planned lazily
def model_keys(counts, part, seed, epoch, first, count):
    """Keys at positions [first, first + count) of part `part`'s endless passes (rule M3), each pass
    in the model's shard order: only the passes those positions are in are listed."""
    per_pass = sum(counts)
    keys, cycle = [], first // per_pass
    while len(keys) < (first % per_pass) + count:
        for shard in model_pass_order(len(counts), seed, epoch, part, cycle):
            keys += [f"{TAGS[part]}s{shard:02d}x{i:02d}" for i in range(counts[shard])]
        cycle += 1
    return keys[first % per_pass :][:count]


def model_share_start(total, parts, index):
    base, extra = divmod(total, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


PARTS = [[5, 3], [4, 4]]


@pytest.mark.parametrize("samples_per_epoch", [10**7, 4 * 10**9])
def test_a_large_epoch_plans_nothing_per_pass_before_len_and_its_first_samples(counted_shards, monkeypatch,
                                                                              samples_per_epoch):
    """10^7 (and 4*10^9) samples over two parts of 8: len() makes no pass and no slot of the
    schedule; the first samples of rank 3 of 4, worker 1 of 2, make the passes of the worker's first
    chunk of pieces (FIRST_CHUNK pieces a part, two a pass) and the schedule's first slots; they are
    the model's samples at those positions."""
    manifests = written(counted_shards, PARTS)
    passes = budget(monkeypatch, mix_module, "pass_order", 4 * FIRST_CHUNK)
    slots = budget(monkeypatch, mix_module, "_slots", 1 << 15, weight=lambda counts, total, first, stop, taken: stop - first)
    mix = wdsprep.mix([wdsprep.Part(m) for m in manifests], samples_per_epoch=samples_per_epoch, seed=3, epoch=2,
                      rank=3, world_size=4)
    with simulated_worker(1, 2):
        assert len(mix) == samples_per_epoch // 4
        assert passes[0] == 0 and slots[0] == 0
        iterator = iter(mix)
        got = [(sample["__part__"], sample["__key__"]) for sample, _ in zip(iterator, range(12))]
    # each part holds half the epoch; equal counts on the worker: the schedule alternates 0, 1, 0, 1, ...
    assert model_schedule([6, 6]) == [0, 1] * 6
    expected = {}
    for part in range(2):
        rank_start, rank_length = model_share_start(samples_per_epoch // 2, 4, 3)
        worker_start, _ = model_share_start(rank_length, 2, 1)
        expected[part] = iter(model_keys(PARTS[part], part, 3, 2, rank_start + worker_start, 6))
    assert got == [(str(part), next(expected[part])) for part in [0, 1] * 6]
    assert passes[0] <= 2 * FIRST_CHUNK and slots[0] <= 1 << 14


def test_a_large_epochized_repeat_is_planned_lazily(counted_shards, monkeypatch):
    manifests = written(counted_shards, PARTS)
    passes = budget(monkeypatch, mix_module, "pass_order", 4 * FIRST_CHUNK)
    mix = wdsprep.mix([wdsprep.Part(manifests[0], repeat=10**7), wdsprep.Part(manifests[1], repeat=1)],
                      mode="epochized", seed=1)
    assert mix.epoch_counts() == [8 * 10**7, 8]
    assert len(mix) == 8 * 10**7 + 8 and passes[0] == 0
    first = next(iter(mix))
    assert first["__part__"] == "0" and first["__key__"] == model_keys(PARTS[0], 0, 1, 0, 0, 1)[0]


def test_a_worker_resumed_deep_into_a_large_epoch_skips_its_passes_unmade(counted_shards, monkeypatch):
    """A state whose worker delivered 100,000 samples of each part: the resumed worker makes the
    passes of its next chunk of pieces, not the 12,500 passes it skipped (the schedule's first 200,000
    slots are made again: it has no closed form)."""
    manifests = written(counted_shards, PARTS)

    def make():
        return wdsprep.mix([wdsprep.Part(m) for m in manifests], samples_per_epoch=10**7, seed=5, epoch=1)

    state = json.loads(json.dumps(make().state_dict()))
    state["workers"]["0"]["parts"] = [{"skip": 100000, "discard": 0, "delivered": 100000}] * 2
    passes = budget(monkeypatch, mix_module, "pass_order", 4 * FIRST_CHUNK)
    resumed = make()
    resumed.load_state_dict(state)
    got = [(sample["__part__"], sample["__key__"]) for sample, _ in zip(iter(resumed), range(4))]
    expected = [iter(model_keys(PARTS[part], part, 5, 1, 100000, 2)) for part in range(2)]
    assert got == [(str(part), next(expected[part])) for part in [0, 1, 0, 1]]
    assert passes[0] <= 2 * FIRST_CHUNK


def test_an_epoch_past_two_to_the_32_is_refused_in_one_line(counted_shards):
    manifests = written(counted_shards, PARTS)
    parts = [wdsprep.Part(m) for m in manifests]
    message = one_line_refusal(lambda: wdsprep.mix(parts, samples_per_epoch=10**12))
    assert "samples_per_epoch=1000000000000: must be a whole number >= 1" in message
    assert "at most 4294967296" in message
    message = one_line_refusal(lambda: wdsprep.mix([wdsprep.Part(manifests[0], repeat=10**12)], mode="epochized"))
    assert "an epoch holds 8000000000000 samples, more than the 4294967296 (2**32)" in message
    message = one_line_refusal(lambda: wdsprep.mix([wdsprep.Part(manifests[0], weight=1e12),
                                                    wdsprep.Part(manifests[1], weight=1)], stop="all"))
    assert "an epoch holds at least" in message and "more than the 4294967296 (2**32)" in message


# ------------------------------------------------------------------------------ manifests of many splits
def calls_to_load(manifest: str) -> int:
    """Python function calls (and calls of C functions) made while loading a manifest."""
    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(count)
    try:
        load_manifest(manifest)
    finally:
        sys.setprofile(None)
    return calls[0]


def test_a_manifest_of_many_empty_splits_costs_a_few_calls_a_split(tmp_path):
    """20,000 and 40,000 empty splits beside one real one: loading costs a bounded number of calls
    per split (a pattern compiled per split was ~340), so 10^6 splits are a matter of reading the JSON."""
    manifest = write_counted_shards(tmp_path / "base", [3, 2])
    data = json.loads(open(manifest).read())
    per_split = []
    for splits in (20000, 40000):
        data["splits"].update({f"e{i}": {"bytes": 0, "samples": 0, "shards": []} for i in range(splits)})
        (tmp_path / "base" / "manifest.json").write_text(json.dumps(data))
        calls = calls_to_load(str(tmp_path / "base"))
        per_split.append(calls / len(data["splits"]))
        data["splits"] = {"train": data["splits"]["train"]}
    assert max(per_split) < 40, per_split
    assert [key for key, _ in zip(wdsprep.dataset(str(tmp_path / "base"), "train"), range(9))]  # it opens and reads


# ------------------------------------------------------------------------------ the read-ahead's connections
def test_connections_past_the_thread_cap_are_refused_in_one_line(counted_shards, monkeypatch):
    """Each Range request at once is a thread of the read-ahead: WDSPREP_MAX_CONNECTIONS=10**6 would
    start a million threads per worker."""
    manifest = counted_shards([3, 2], tag="a")
    monkeypatch.setenv("WDSPREP_MAX_CONNECTIONS", str(10**6))
    message = one_line_refusal(lambda: wdsprep.dataset(manifest, "train"))
    assert message.startswith("WDSPREP_MAX_CONNECTIONS='1000000': must be a whole number >= 1 (") and "at most 256" in message
    monkeypatch.delenv("WDSPREP_MAX_CONNECTIONS")
    assert "max_connections=257: must be a whole number >= 1" in one_line_refusal(
        lambda: wdsprep.dataset(manifest, "train", max_connections=257))
    assert wdsprep.dataset(manifest, "train", max_connections=256).read_options.max_connections == 256
