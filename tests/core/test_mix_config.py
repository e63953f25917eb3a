"""Configuring a mix: a bad mix is one `ConfigError` line before any shard is read; a part smaller
than the ranks; parts with their own stages (`wdsprep.decode()`, stages that expand a sample into
several training samples with `outputs_per_sample`: proportions counted in outputs, against the
reference model of test_mix_oracle extended to outputs); a mix file (TOML) that names the reader
functions of built-in sources and never imports anything it names."""
import collections
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import wdsprep
from wdsprep.testing import RangeHTTPServer

from tests.timeouts import SUBPROCESS

from .test_mix_oracle import (
    TAGS,
    model_block_shuffle,
    model_contiguous_run,
    model_epoch_counts,
    model_interleave,
    model_part_epoch,
    model_worker,
    named,
    part_key,
    part_keys,
    prefix_deviations,
    real_worker,
    written,
)
from .test_plan_oracle import simulated_worker


def one_line_refusal(make) -> str:
    with pytest.raises(wdsprep.ConfigError) as error:
        make()
    assert "\n" not in str(error.value)
    return str(error.value)


# ------------------------------------------------------------------------------ bad mixes
BAD_PARTS = {  # the second part of a mix, its mode, and what the one line says
    "weight zero": ({"weight": 0}, "weighted", "part 1: weight=0: must be a number > 0"),
    "weight negative": ({"weight": -1.5}, "weighted", "part 1: weight=-1.5: must be a number > 0"),
    "weight text": ({"weight": "2"}, "weighted", "part 1: weight='2': must be a number > 0"),
    "weight nan": ({"weight": float("nan")}, "weighted", "part 1: weight=nan: must be a number > 0"),
    "weight infinite": ({"weight": float("inf")}, "weighted", "part 1: weight=inf: must be a number > 0"),
    "weight boolean": ({"weight": True}, "weighted", "part 1: weight=True: must be a number > 0"),
    "weight past a float": ({"weight": 10**400}, "weighted",
                            "part 1: weight=an integer of about 401 digits: must be a number > 0"),
    "repeat past a float": ({"repeat": 10**400}, "epochized", "part 1: repeat=an integer of"),
    "weight a complex number": ({"weight": 2j}, "weighted", "part 1: weight=2j: must be a number > 0"),
    "name a number": ({"name": 5}, "weighted", "part 1: name=5: must be a non-empty string (what __part__ says)"),
    "name empty": ({"name": ""}, "weighted", "part 1: name='': must be a non-empty string (what __part__ says)"),
    "name a list": ({"name": ["b"]}, "weighted", "part 1: name=['b']: must be a non-empty string (what __part__ says)"),
    "repeat zero": ({"repeat": 0}, "epochized", "part 1: repeat=0: must be a number > 0"),
    "repeat negative": ({"repeat": -0.25}, "epochized", "part 1: repeat=-0.25: must be a number > 0"),
    "repeat in weighted": ({"repeat": 2}, "weighted", "part 1: repeat is for mode='epochized'"),
    "weight in epochized": ({"weight": 2}, "epochized", "part 1: weight is for mode='weighted'"),
    "no such split": ({"split": "valid"}, "weighted", "part 1: no split 'valid' in"),
    "unknown field": ({"wieght": 2}, "weighted", "part 1: unknown field(s) wieght"),
    "stages not callable": ({"stages": (3,)}, "weighted", "part 1: stages must be reader stages"),
    "outputs of another length": ({"outputs_per_sample": [1, 2]}, "weighted",
                                  "part 1: outputs_per_sample must give a count >= 0 for each of the 6 samples"),
    "a selection that keeps nothing": ({"keys": ["nope"]}, "weighted", "part 1: keys: 'nope' not in split 'train'"),
    "a selection limit of zero": ({"limit": 0}, "weighted", "part 1: limit=0: must be a whole number >= 1"),
}


@pytest.fixture
def served(counted_shards):
    """Part 0 of every bad mix: counted shards over HTTP, so the requests show what was read."""
    manifest = counted_shards([3, 2], tag="a")
    with RangeHTTPServer(manifest.rsplit("/", 1)[0]) as server:
        yield server, f"{server.url}/manifest.json"


def shard_requests(server):
    return [r["name"] for r in server.requests if r["name"] != "manifest.json"]


@pytest.mark.parametrize("case", sorted(BAD_PARTS))
def test_a_bad_part_is_one_config_error_line_before_any_shard_is_read(served, counted_shards, case):
    server, good = served
    fields, mode, expected = BAD_PARTS[case]
    second = {"location": counted_shards([4, 2], tag="b"), **fields}
    message = one_line_refusal(lambda: wdsprep.mix([{"location": good}, second], mode=mode))
    assert message.startswith("mix: ") and expected in message
    assert shard_requests(server) == []


def test_more_bad_mixes_are_one_config_error_line_before_any_shard_is_read(served, counted_shards):
    server, good = served
    other = counted_shards([4, 2], tag="b")
    empty = counted_shards([0, 0], tag="e")
    cases = [
        (lambda: wdsprep.mix([{"location": good}, {"location": empty}]), "part 1: split 'train' of"),
        (lambda: wdsprep.mix([{"location": good}, {"location": counted_shards([3, 2], tag="a")}]),
         "part 1: the same part as part 0"),
        (lambda: wdsprep.mix([{"location": good}, {"weight": 2}]), "part 1: no location"),
        (lambda: wdsprep.mix([{"location": good}, other]), "part 1: a wdsprep.Part or a dict of its fields"),
        (lambda: wdsprep.mix([{"location": good, "name": "x"}, {"location": other, "name": "x"}]),
         "part names must differ"),
        (lambda: wdsprep.mix([]), "mix: no parts"),
        (lambda: wdsprep.mix([{"location": good}], mode="weigthed"), "mode='weigthed': must be one of 'weighted', 'epochized'"),
        (lambda: wdsprep.mix([{"location": good}], stop="last"), "stop='last': must be one of 'first', 'all'"),
        (lambda: wdsprep.mix([{"location": good}], samples_per_epoch=0), "samples_per_epoch=0: must be a whole number >= 1"),
        (lambda: wdsprep.mix([{"location": good}], samples_per_epoch=2.5), "samples_per_epoch=2.5: must be a whole number >= 1"),
        (lambda: wdsprep.mix([{"location": good}], mode="epochized", samples_per_epoch=4),
         "samples_per_epoch is for mode='weighted'"),
        (lambda: wdsprep.mix([{"location": good}], equalize="both"), "equalize='both': must be one of None, 'pad', 'drop'"),
    ]
    for make, expected in cases:
        assert expected in one_line_refusal(make)
    assert "has no samples" in one_line_refusal(cases[0][0])
    assert shard_requests(server) == []


def test_numpy_weights_and_repeats_read_as_the_numbers_they_are(counted_shards):
    """np.float32(2), np.int64(1), np.float64(0.5): the same epoch and samples as 2, 1 and 0.5."""
    parts = [[3, 2], [4], [2, 2]]
    manifests = written(counted_shards, parts)
    for mode, numpy_shares, shares in (("weighted", [np.float32(2), np.int64(1), np.float64(0.5)], [2, 1, 0.5]),
                                        ("epochized", [np.float32(1.5), np.int32(2), np.float16(0.5)], [1.5, 2, 0.5])):
        share = "weight" if mode == "weighted" else "repeat"
        mix = wdsprep.mix([{"location": m, share: s} for m, s in zip(manifests, numpy_shares)], mode=mode,
                          stop="all", seed=3)
        assert [named(sample) for sample in mix] == model_worker(parts, shares, mode=mode, seed=3,
                                                                 **({"stop": "all"} if mode == "weighted" else {}))


def test_parts_that_keep_the_same_samples_are_refused_naming_both(counted_shards):
    """The same split three ways (every sample; limit=10**6; every key, listed backwards) is one part
    read three times: refused as an identical part is, naming the two. A selection that keeps part of
    what another part reads (a subset weighed again) is a mix."""
    manifest = counted_shards([3, 2], tag="a")
    every_key = [key for shard in part_keys([3, 2], 0) for key in shard]
    message = one_line_refusal(lambda: wdsprep.mix([{"location": manifest, "name": "all"},
                                                    {"location": manifest, "name": "limited", "limit": 10**6},
                                                    {"location": manifest, "name": "listed", "keys": every_key[::-1]}]))
    assert message == ("mix: part 1 (limited): the same samples as part 0 (all) (same shards and split; selections "
                       "(none) and (limit 1000000) keep the same 5): give it one part with the sum of the weights")
    message = one_line_refusal(lambda: wdsprep.mix([{"location": manifest, "keys": every_key[:2]},
                                                    {"location": manifest, "limit": 2, "name": "b"}]))
    assert message.startswith("mix: part 1 (b): the same samples as part 0 (same shards and split; selections "
                              "(2 keys) and (limit 2) keep the same 2)")
    mix = wdsprep.mix([{"location": manifest, "name": "all"}, {"location": manifest, "name": "first", "limit": 3}])
    assert [part.size for part in mix.parts] == [5, 3]
    assert {key for name, key in map(named, mix) if name == "first"} <= set(every_key[:3])


def test_an_epochized_repeat_that_rounds_to_no_sample_is_said(counted_shards):
    """repeat=0.001 of 8 samples is 0.008, 0 by the rule (size x repeat, half up): the part is in no
    epoch, as the rule says, and a warning says so and names the smallest repeat that gives one."""
    manifests = written(counted_shards, [[5, 3], [4]])
    with pytest.warns(UserWarning, match=r"part 0: repeat=0.001 of its 8 samples rounds to 0 .*at least 0.0625 gives"):
        mix = wdsprep.mix([{"location": manifests[0], "repeat": 0.001}, {"location": manifests[1]}], mode="epochized")
    assert mix.epoch_counts() == model_epoch_counts([8, 4], [0.001, 1], mode="epochized") == [0, 4]
    assert {name for name, _ in map(named, mix)} == {"1"}


# ------------------------------------------------------------------------------ a part smaller than the ranks
SMALL = [[1], [5, 5, 5, 5]]  # stop="all" with weights 1:10 -> 2 and 20 samples: part 0 cycles to 2 < 3 ranks
SMALL_WEIGHTS = [1, 10]


def test_a_part_with_fewer_samples_than_ranks_is_refused_with_drop(counted_shards):
    manifests = written(counted_shards, SMALL)
    assert model_epoch_counts([1, 20], SMALL_WEIGHTS, stop="all") == [2, 20]
    message = one_line_refusal(lambda: wdsprep.mix(
        [{"location": m, "weight": w} for m, w in zip(manifests, SMALL_WEIGHTS)], stop="all", equalize="drop",
        rank=0, world_size=3))
    assert "part 0: 2 sample(s) in the epoch for 3 ranks: equalize='drop' would leave it out" in message


def test_a_part_with_fewer_samples_than_ranks_times_workers_is_padded_onto_every_rank(counted_shards):
    """equalize="pad": a rank short of the part repeats one of its samples, so every rank holds the
    part; of each rank's 2 workers, only the first has it (a rank's list is cut into worker runs)."""
    manifests = written(counted_shards, SMALL)
    table = {}
    for rank in range(3):
        for worker in range(2):
            table[rank, worker] = real_worker(manifests, SMALL_WEIGHTS, workers=2, worker=worker, world=3, rank=rank,
                                              equalize="pad", stop="all", seed=4)
            assert table[rank, worker] == model_worker(SMALL, SMALL_WEIGHTS, world=3, rank=rank, workers=2,
                                                       worker=worker, equalize="pad", stop="all", seed=4)
    for worker in range(2):
        assert len({len(table[rank, worker]) for rank in range(3)}) == 1  # equal batches on every rank
    small = [[name for name, _ in table[rank, worker]].count("0") for rank in range(3) for worker in range(2)]
    assert small == [1, 0, 1, 0, 1, 0]
    assert {key for stream in table.values() for name, key in stream if name == "0"} == {"as00x00"}


# ------------------------------------------------------------------------------ parts with their own stages
def test_a_decoded_part_and_a_raw_part_each_keep_their_own_stages(counted_shards):
    parts = [[3, 2], [4]]
    manifests = written(counted_shards, parts)
    mix = wdsprep.mix([wdsprep.Part(manifests[0], stages=(wdsprep.decode(strip=True),)), wdsprep.Part(manifests[1])], seed=2,
                      epoch=1)
    samples = list(mix)
    assert [named(s) for s in samples] == model_worker(parts, [1, 1], seed=2, epoch=1)
    for sample in samples:
        if sample["__part__"] == "0":
            assert isinstance(sample["value"], np.ndarray) and sample["meta"]["shard"] == int(sample["__key__"][2:4])
        else:
            assert isinstance(sample["value.npy"], bytearray) and "value" not in sample  # raw member bytes


EXPANDED = [[3, 0, 4, 2], [5, 1]]


def outputs_of(key):
    """What the test's expanding stage makes of a sample: 0 to 3 outputs, from its key."""
    shard, i = int(key[2:4]), int(key[5:7])
    return (shard + 2 * i) % 4


def expand(source):
    for sample in source:
        for j in range(outputs_of(sample["__key__"])):
            yield {"__key__": f"{sample['__key__']}/{j}"}


def manifest_order_outputs(counts, p):
    return [outputs_of(key) for shard in part_keys(counts, p) for key in shard]


def model_weighted_run(items, weights, parts, index):
    """The samples whose output midpoint lies in share `index` of the outputs (divmod rule)."""
    total = sum(weights)
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    stop = start + base + (1 if index < extra else 0)
    before, mine = 0, []
    for item, weight in zip(items, weights):
        if start <= before + Fraction(weight, 2) < stop:
            mine.append(item)
        before += weight
    return mine


def model_expanded_worker(shares, *, world, rank, workers, worker, seed, epoch, stop):
    """One worker's outputs with equalize=None: part 0 expanded by the stage (dealt on outputs),
    part 1 one output per sample; the schedule counts outputs."""
    sizes = [sum(manifest_order_outputs(EXPANDED[0], 0)), sum(EXPANDED[1])]
    counts = model_epoch_counts(sizes, shares, stop=stop)
    outputs = {key: outputs_of(key) for shard in part_keys(EXPANDED[0], 0) for key in shard}
    streams = []
    for p in range(2):
        items = model_part_epoch(part_keys(EXPANDED[p], p), counts[p], seed, epoch, p,
                                 outputs if p == 0 else None)
        weights = [outputs[key] if p == 0 else 1 for key in items]
        mine = model_weighted_run(items, weights, world, rank)
        run = model_weighted_run(mine, [outputs[key] if p == 0 else 1 for key in mine], workers, worker)
        streams.append([f"{key}/{j}" for key in run for j in range(outputs[key])] if p == 0 else run)
    return counts, [(str(p), key) for p, key in model_interleave(streams, 0, ())]


def expanded_mix(manifests, shares, **options):
    return wdsprep.mix([wdsprep.Part(manifests[0], weight=shares[0], stages=(expand,),
                                     outputs_per_sample=manifest_order_outputs(EXPANDED[0], 0)),
                        wdsprep.Part(manifests[1], weight=shares[1])], **options)


@pytest.mark.parametrize("stop", ["first", "all"])
def test_an_expanding_part_is_mixed_in_proportion_to_its_outputs(counted_shards, stop):
    manifests = written(counted_shards, EXPANDED)
    shares = [2, 1]
    for rank in range(2):
        for worker in range(2):
            counts, expected = model_expanded_worker(shares, world=2, rank=rank, workers=2, worker=worker, seed=7,
                                                     epoch=3, stop=stop)
            with simulated_worker(worker, 2):
                mix = expanded_mix(manifests, shares, seed=7, epoch=3, stop=stop, rank=rank, world_size=2,
                                   equalize=None)
                assert mix.epoch_counts() == counts
                got = [named(s) for s in mix]
            assert got == expected, (rank, worker)
            assert prefix_deviations([name for name, _ in got], "01", 0) < 1


@pytest.mark.parametrize("made", ["fewer", "more"])
def test_a_part_whose_stage_makes_other_counts_than_it_declared(counted_shards, made):
    """Part 0 declares outputs_of(key) outputs a sample, but its stage makes one of each (fewer) or
    one more of each (more) sample that has any: the schedule is the declared counts' (the model's
    labels); a slot of a part with no output left goes, the next slots take the next outputs, and
    what a part makes past its declared count comes after the schedule, part by part."""
    manifests = written(counted_shards, EXPANDED)

    def stage(source):
        for sample in source:
            key, declared = sample["__key__"], outputs_of(sample["__key__"])
            for j in range(min(declared, 1) if made == "fewer" else declared + (declared > 0)):
                yield {"__key__": f"{key}/{j}"}

    _, declared = model_expanded_worker([2, 1], world=1, rank=0, workers=1, worker=0, seed=7, epoch=3, stop="all")
    samples = [key[:-2] for p, key in declared if p == "0" and key.endswith("/0")]  # part 0's, in order (passes repeat)
    streams = {"0": [f"{key}/{j}" for key in samples for j in range(1 if made == "fewer" else outputs_of(key) + 1)],
               "1": [key for p, key in declared if p == "1"]}
    expected, taken = [], {"0": 0, "1": 0}
    for p, _ in declared:  # the declared schedule's slots, each the part's next output if it has one
        if taken[p] < len(streams[p]):
            expected.append((p, streams[p][taken[p]]))
            taken[p] += 1
    expected += [(p, key) for p in "01" for key in streams[p][taken[p]:]]
    mix = wdsprep.mix([wdsprep.Part(manifests[0], weight=2, stages=(stage,),
                                    outputs_per_sample=manifest_order_outputs(EXPANDED[0], 0)),
                       wdsprep.Part(manifests[1], weight=1)], seed=7, epoch=3, stop="all", equalize=None)
    got = [named(sample) for sample in mix]
    assert got == expected
    slots = sum(p == "0" for p, _ in declared)  # the case is what it says: part 0 runs out / runs over
    assert len(streams["0"]) < slots if made == "fewer" else len(streams["0"]) > slots


def test_an_expanding_part_gives_equal_outputs_per_worker_on_every_rank_with_pad(counted_shards):
    manifests = written(counted_shards, EXPANDED)
    table = collections.defaultdict(list)
    for rank in range(3):
        for worker in range(2):
            with simulated_worker(worker, 2):
                mix = expanded_mix(manifests, [1, 1], seed=1, epoch=0, stop="all", rank=rank, world_size=3,
                                   equalize="pad")
                got = [named(s) for s in mix]
            table[worker].append(collections.Counter(name for name, _ in got))
            assert prefix_deviations([name for name, _ in got], "01", 0) < 1
    for worker, counts in table.items():
        assert all(count == counts[0] for count in counts), worker


# ------------------------------------------------------------------------------ a minecraft part: pairs
def wdsprep_cli(*args):
    run = subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True, timeout=SUBPROCESS)
    assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def minecraft(tmp_path_factory):
    root = tmp_path_factory.mktemp("mc")
    wdsprep_cli("synth", "minecraft", str(root / "in"), "--size", "small", "--quiet")
    wdsprep_cli("convert", "minecraft", str(root / "in"), str(root / "out"), "--shard-bytes", "20KB",
                "--window-frames", "12", "--window-overlap", "4", "--quiet")
    return str(root / "out" / "manifest.json")


def every_pair(manifest, history):
    import webdataset as wds

    stage = wdsprep.minecraft.pairs(history_length=history)
    return [p["__key__"] for p in wds.WebDataset(wdsprep.urls(manifest, "train"), shardshuffle=False).compose(stage)]


def test_minecraft_pairs_mixed_with_a_counted_part_are_proportioned_in_pairs(minecraft, counted_shards):
    history = 2
    pairs = every_pair(minecraft, history)
    other = counted_shards([6, 6, 6], tag="a")
    parts = [wdsprep.Part(minecraft, weight=3, stages=(wdsprep.minecraft.pairs(history_length=history),),
                          outputs_per_sample=wdsprep.minecraft.pair_counts(history_length=history), name="mc"),
             wdsprep.Part(other, weight=1, name="counted")]
    assert wdsprep.mix(parts, seed=0).epoch_counts() == model_epoch_counts([len(pairs), 18], [3, 1])
    table, seen = collections.defaultdict(list), collections.Counter()
    for rank in range(2):
        for worker in range(2):
            with simulated_worker(worker, 2):
                got = [named(s) for s in wdsprep.mix(parts, seed=0, epoch=1, rank=rank, world_size=2)]
            assert prefix_deviations([name for name, _ in got], ["mc", "counted"], 0) < 1
            table[worker].append(collections.Counter(name for name, _ in got))
            seen.update(got)
    for worker, counts in table.items():  # equalize="pad" (the default): equal outputs of each part
        assert all(count == counts[0] for count in counts), worker
    assert {key for name, key in seen if name == "mc"} <= set(pairs)


# ------------------------------------------------------------------------------ a mix file
def write_text(path, text):
    path.write_text(text)
    return str(path)


@pytest.fixture
def mix_directory(tmp_path, minecraft):
    """A directory with a counted part in a/ (a mix file names it relatively) and a key file."""
    from .shardsets import write_counted_shards

    write_counted_shards(tmp_path / "a", [4, 3, 5], tag="a")
    (tmp_path / "keys.txt").write_text("as00x01\nas02x04\nas01x00\nas02x00\n")
    return tmp_path


def test_a_mix_file_reads_what_the_same_mix_written_in_python_reads(mix_directory, minecraft):
    path = write_text(mix_directory / "mix.toml", f"""
mode = "weighted"
stop = "all"
seed = 9
shuffle_buffer = 3

[[part]]
location = "a/manifest.json"
weight = 1.5
name = "counted"

[[part]]
location = "{minecraft}"
weight = 2
name = "pairs"
stage = {{name = "minecraft.pairs", history_length = 2}}
outputs_per_sample = {{name = "minecraft.pair_counts", history_length = 2}}

[[part]]
location = "a/manifest.json"
keys = "keys.txt"
name = "chosen"
""")
    in_python = [
        wdsprep.Part(str(mix_directory / "a" / "manifest.json"), weight=1.5, name="counted"),
        wdsprep.Part(minecraft, weight=2, name="pairs", stages=(wdsprep.minecraft.pairs(history_length=2),),
                     outputs_per_sample=wdsprep.minecraft.pair_counts(history_length=2)),
        wdsprep.Part(str(mix_directory / "a" / "manifest.json"), name="chosen",
                     keys=["as00x01", "as02x04", "as01x00", "as02x00"]),
    ]
    for rank in range(2):
        from_file = [named(s) for s in wdsprep.mix(path, epoch=1, rank=rank, world_size=2)]
        from_python = [named(s) for s in wdsprep.mix(in_python, stop="all", seed=9, shuffle_buffer=3, epoch=1,
                                                     rank=rank, world_size=2)]
        assert from_file == from_python
        assert {name for name, _ in from_file} == {"counted", "pairs", "chosen"}
        assert {key for name, key in from_file if name == "chosen"} <= {"as00x01", "as02x04", "as01x00", "as02x00"}
    # options given to mix() win over the file's
    assert wdsprep.mix(path, seed=4).seed == 4 and wdsprep.mix(path).seed == 9


MARKER_MODULE = """
import pathlib
pathlib.Path(__file__).with_name("imported.marker").write_text("the mix file imported me")

def stage(**arguments):
    pathlib.Path(__file__).with_name("called.marker").write_text("the mix file called me")
    return lambda source: source
"""


@pytest.mark.parametrize("name", ["mix_marker_module.stage", "mix_marker_module:stage", "os.system",
                                  "wdsprep.sources.minecraft.read.pairs", "minecraft.read.pairs",
                                  "minecraft.nope", "minecraft._pairs", "voxels.synth", "rawnind.fetch",
                                  "rawnind.serve_main", "minecraft.episode_key"])
def test_a_mix_file_names_only_reader_functions_of_built_in_sources(tmp_path, monkeypatch, counted_shards, name):
    """Nothing a mix file names is imported or called unless it is a reader function of a built-in
    source: a module on the path that writes a marker when imported is never imported, and
    voxels.synth (which would write a dataset into `directory`) is never called."""
    (tmp_path / "mix_marker_module.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_text(tmp_path / "mix.toml", f"""
[[part]]
location = "{counted_shards([3, 3], tag="a")}"
stage = {{name = "{name}", directory = "{tmp_path / "synth"}", command = "touch {tmp_path / "ran"}"}}
""")
    message = one_line_refusal(lambda: wdsprep.mix(path))
    assert message.startswith(f"{path}: part 0: stage: {name!r} is not a reader function of a built-in source")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mix.toml", "mix_marker_module.py"]
    assert "mix_marker_module" not in sys.modules


def test_bad_mix_files_are_one_config_error_line_naming_the_file(tmp_path, counted_shards):
    good = counted_shards([3, 3], tag="a")
    cases = {
        "missing.toml": (None, "cannot read the mix file"),
        "broken.toml": ("[[part]\nlocation = 1", "not valid TOML"),
        "no-parts.toml": ('seed = 1\n', "a mix file needs one [[part]] table per part"),
        "unknown-option.toml": (f'epochs = 3\n[[part]]\nlocation = "{good}"\n', "unknown option(s) epochs"),
        "bad-weight.toml": (f'[[part]]\nlocation = "{good}"\nweight = -1\n', "part 0: weight=-1: must be a number > 0"),
        "bad-field.toml": (f'[[part]]\nlocation = "{good}"\nwieght = 2\n', "part 0: unknown field(s) wieght"),
        "bad-stage.toml": (f'[[part]]\nlocation = "{good}"\nstage = "minecraft.pairs"\n',
                           'part 0: stage: a table with name = "<source>.<function>"'),
        "bad-arguments.toml": (f'[[part]]\nlocation = "{good}"\nstage = {{name = "minecraft.pairs", window = 3}}\n',
                               "part 0: stage: minecraft.pairs: "),
        "bad-mode.toml": (f'mode = "mixed"\n[[part]]\nlocation = "{good}"\n', "mode='mixed': must be one of 'weighted', 'epochized'"),
        "missing-part.toml": ('[[part]]\nlocation = "nowhere/manifest.json"\n',
                              "part 0: " + str(tmp_path / "nowhere" / "manifest.json") + ": cannot read manifest"),
    }
    for name, (text, expected) in cases.items():
        path = str(tmp_path / name) if text is None else write_text(tmp_path / name, text)
        with pytest.raises(wdsprep.WdsprepError) as error:
            wdsprep.mix(path)
        message = str(error.value)
        assert "\n" not in message and path in message and expected in message, (name, message)


def test_an_expanding_part_resumed_elastically_delivers_the_epochs_outputs(counted_shards):
    """Three ranks stop mid-sample (some outputs of a sample delivered), two resume from the list
    of states: old and new together deliver the epoch's outputs, each as often as the epoch holds it
    (stop="all": a part that cycles holds some twice; dealt as is)."""
    manifests = written(counted_shards, EXPANDED)
    plan = dict(seed=7, epoch=3, stop="all", equalize=None)
    epoch = collections.Counter()
    for rank in range(3):
        epoch.update(named(s) for s in expanded_mix(manifests, [2, 1], rank=rank, world_size=3, **plan))
    delivered, states = collections.Counter(), []
    for rank, stop in zip(range(3), [2, 5, 1]):
        run = expanded_mix(manifests, [2, 1], rank=rank, world_size=3, **plan)
        iterator = iter(run)
        delivered.update(named(next(iterator)) for _ in range(stop))
        states.append(run.state_dict())
    assert any(part["discard"] for state in states for part in state["workers"]["0"]["parts"])  # mid-sample
    for rank in range(2):
        resumed = expanded_mix(manifests, [2, 1], rank=rank, world_size=2, **plan)
        resumed.load_state_dict(states)
        delivered.update(named(s) for s in resumed)
    assert delivered == epoch and max(epoch.values()) == 2


@pytest.mark.parametrize("stop", [1, 2, 4, 7])
def test_a_rank_resumed_from_one_stopped_mid_sample_yields_the_counts_it_says(counted_shards, stop):
    """One rank stops after `stop` outputs (mid-sample for most: its state keeps a discard); two ranks
    resume from its state. What the rest of the epoch holds of the expanding part is then one run of
    its passes less the outputs already delivered of its current sample: each new rank's
    `part_counts()` says what it then yields, and old and new together deliver the epoch's outputs."""
    manifests = written(counted_shards, EXPANDED)
    plan = dict(seed=7, epoch=3, stop="all", equalize=None)
    epoch = collections.Counter(named(s) for s in expanded_mix(manifests, [2, 1], rank=0, world_size=1, **plan))
    run = expanded_mix(manifests, [2, 1], rank=0, world_size=1, **plan)
    iterator = iter(run)
    delivered = collections.Counter(named(next(iterator)) for _ in range(stop))
    state = run.state_dict()
    discards = [part["discard"] for part in state["workers"]["0"]["parts"]]
    for rank in range(2):
        resumed = expanded_mix(manifests, [2, 1], rank=rank, world_size=2, **plan)
        resumed.load_state_dict([state])
        said = resumed.part_counts()
        outputs = [named(s) for s in resumed]
        assert collections.Counter(name for name, _ in outputs) == +collections.Counter(said), (rank, discards)
        delivered.update(outputs)
    assert delivered == epoch


def test_a_mix_says_how_many_samples_of_each_part_a_rank_yields(counted_shards):
    parts, weights = [[3, 1, 4], [5, 2], [2]], [1, 2, 1]
    manifests = written(counted_shards, parts)
    for rank in range(3):
        per_part = collections.Counter()
        for worker in range(2):
            per_part.update(name for name, _ in real_worker(manifests, weights, workers=2, worker=worker, world=3,
                                                            rank=rank, equalize="pad", stop="all", seed=2))
        mix = wdsprep.mix([{"location": m, "weight": w} for m, w in zip(manifests, weights)], stop="all", seed=2,
                          rank=rank, world_size=3)
        assert mix.part_counts(num_workers=2) == dict(per_part)
        assert mix.samples_per_rank(num_workers=2) == sum(per_part.values())
