"""Mixing: what `wdsprep.mix` costs over reading its parts alone, and LitData's
`CombinedStreamingDataset` on the same parts (CPU per sample, and whether its resume is exact).

Three parts of different sizes (4 KiB float32 arrays + a small dict, different data in each) are
written as files in the `generic` source's layout and converted by the command line (`wdsprep
convert generic --codec none`, several shards per part); LitData's copies are written with its own
`BinaryWriter` (uncompressed). Every measurement runs in a fresh process, single process (no
DataLoader workers), decoding each sample to an array and a dict, best of the repeats, the systems
interleaved; CPU is the measured loop's user + system time, of the second of two passes in the process
(each of datasets made anew, so each plans its epoch): the first pays the process's one-time costs
(lazy imports, first touches), which in a pass of ~150 ms of CPU are 5-10x a sample's cost and vary
from system to system; it is shown beside (`first pass`).

- wdsprep, parts alone: each part's `wdsprep.dataset(...)` (shuffle buffer 1,000, and none), one
  after the other.
- wdsprep, mix: `wdsprep.mix` of the three parts in mode "epochized" with repeat 1 (every sample of
  every part once: the same samples as the parts alone), the same shuffle buffer, each part decoded
  by its own `wdsprep.decode()` stage (shuffle buffer 1,000, and none); and weighted 3:2:1 with
  stop="all" (parts cycle).
  Overhead = mix ÷ parts alone - 1, CPU per sample (the goal: at most 5%): best ÷ best, and the
  median over PAIRS rounds in one process, each a pass of the mix and one of its baseline, in turn
  first, of the ratio of the two (`alternated`): the machine's speed drifts between processes and
  minutes apart by more than the few percent a goal is about, and two passes a second apart share
  its state of the moment.
- wdsprep, schedule: the same three parts in an epoch of `samples_per_epoch` = the parts' sizes
  together, weighted 3:2:1 (no schedule), and by a schedule of four phases ((0, 3:2:1), (0.25, 4:1:1),
  (0.5, 2:3:1), (0.75, 3:2:1)) that gives each part the same count over the epoch (10,500, 7,000 and
  3,500: the same samples, in another order), and by 16 phases of 1,312-1,313 samples, each with weights of
  its own (about 3:2:1 over the epoch); overhead = scheduled ÷ unscheduled - 1 (the goal: at most 2%),
  its alternated median over SCHEDULE_PAIRS rounds (a median of 16 moves by about a point from run to
  run), and what a phase start costs (the pass's extra CPU ÷ the phases after the first).
- LitData, parts alone: each part's `StreamingDataset(shuffle=True)`; combined:
  `CombinedStreamingDataset` of the three, iterate_over_all=True (every sample once) and weighted
  3:2:1 (iterate_over_all=False).
- Resume: a `StreamingDataLoader` (LitData) / `wdsprep.Loader` (wdsprep) over the combined / mixed
  weighted parts, batch 16, 0 and 2 workers: the uninterrupted epoch's samples (twice: is a second
  run the same?), then a fresh loader resumed from the state saved after a third of the batches;
  exact when the resumed run's samples are the uninterrupted run's rest, in order. Both runs' samples are compared by identity (part,
  index), so a mismatch is counted as samples missing, repeated, or in another order.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from _smoke import sized
from bench_peers import _child_env, _cpu, convert_files, write_sample_files  # the generic layout, `wdsprep convert`

PARTS = {"a": sized(12_000, 120), "b": sized(6_000, 60), "c": sized(3_000, 40)}  # samples of each part
WEIGHTS = {"a": 3, "b": 2, "c": 1}
ELEMENTS = 1024  # float32: 4 KiB arrays
SHARD_BYTES = sized("4MB", "120KB")
BUFFER = 1000
REPEATS = sized(5, 1)
PAIRS = sized(16, 2)  # alternated passes of a mix and its baseline in one process (`alternated`)
# a schedule's goal is a smaller difference (2%) than the median of 16 pairs holds still (it moved by about
# one point from run to run): its rows take more pairs
SCHEDULE_PAIRS = sized(100, 2)
RESUME_BATCH = 16
SCHEDULE = [(0, [3, 2, 1]), (0.25, [4, 1, 1]), (0.5, [2, 3, 1]), (0.75, [3, 2, 1])]  # 3:2:1 over the epoch
# 16 phases, each with weights of its own, in pairs that give and take back: about 3:2:1 over the epoch
SCHEDULE16 = [(k / 16, [3 + (1 if k % 2 else -1) * (k // 2 + 1) / 10, 2 - (1 if k % 2 else -1) * (k // 2 + 1) / 10, 1])
              for k in range(16)]
SCHEDULES = {"wdsprep-mix-scheduled": SCHEDULE, "wdsprep-mix-scheduled-16": SCHEDULE16}
READS = ("wdsprep-alone", "wdsprep-mix", "wdsprep-alone-unbuffered", "wdsprep-mix-unbuffered", "wdsprep-mix-weighted",
         "wdsprep-mix-sized", "wdsprep-mix-scheduled", "wdsprep-mix-scheduled-16", "litdata-alone", "litdata-combined",
         "litdata-combined-weighted")
BASELINE = {"wdsprep-mix": "wdsprep-alone", "wdsprep-mix-unbuffered": "wdsprep-alone-unbuffered",
            "wdsprep-mix-weighted": "wdsprep-alone", "wdsprep-mix-sized": "wdsprep-alone",
            "wdsprep-mix-scheduled": "wdsprep-mix-sized", "wdsprep-mix-scheduled-16": "wdsprep-mix-sized",
            "litdata-combined": "litdata-alone",
            "litdata-combined-weighted": "litdata-alone"}


def _samples(part: str, count: int):
    rng = np.random.default_rng(ord(part))  # different data in every part
    for i in range(count):
        yield i, rng.standard_normal(ELEMENTS).astype(np.float32), {"part": part, "index": i}


# ------------------------------------------------------------------------------------------ writing
def write_litdata(directory: pathlib.Path, part: str, count: int) -> None:
    from litdata.streaming.writer import BinaryWriter

    from wdsprep.sizes import parse_size

    writer = BinaryWriter(str(directory), chunk_bytes=parse_size(SHARD_BYTES))
    for i, array, meta in _samples(part, count):
        writer.add_item(i, {"array": array, "meta": meta})
    writer.done()
    writer.merge()


# ------------------------------------------------------------------------------------------ reading
def _wdsprep_parts(workdir: str, **part_options):
    import wdsprep

    return [wdsprep.Part(os.path.join(workdir, "wdsprep", part, "manifest.json"), name=part,
                         stages=(wdsprep.decode(strip=True),), **{k: v[part] for k, v in part_options.items()})
            for part in PARTS]


def _wdsprep_mix(workdir: str, weighted: bool, buffer: int = BUFFER, scheduled: bool | list | None = None):
    """The mix a row reads: epochized (repeat 1), weighted 3:2:1 with stop="all", or (`scheduled`
    False / a schedule) an epoch of the parts' sizes together, weighted 3:2:1 / by that schedule."""
    import wdsprep

    if scheduled is not None:
        size = sum(PARTS.values())
        if scheduled:
            return wdsprep.mix(_wdsprep_parts(workdir), schedule=scheduled, samples_per_epoch=size, seed=0,
                               shuffle_buffer=buffer, equalize=None)
        return wdsprep.mix(_wdsprep_parts(workdir, weight=WEIGHTS), samples_per_epoch=size, seed=0,
                           shuffle_buffer=buffer, equalize=None)
    if weighted:
        return wdsprep.mix(_wdsprep_parts(workdir, weight=WEIGHTS), stop="all", seed=0, shuffle_buffer=buffer,
                           equalize=None)
    return wdsprep.mix(_wdsprep_parts(workdir, repeat=dict.fromkeys(PARTS, 1)), mode="epochized", seed=0,
                       shuffle_buffer=buffer, equalize=None)


def _litdata_datasets(workdir: str):
    from litdata import StreamingDataset

    return [StreamingDataset(os.path.join(workdir, "litdata", part), shuffle=True, seed=0) for part in PARTS]


def _litdata_combined(workdir: str, weighted: bool):
    from litdata import CombinedStreamingDataset

    if weighted:
        return CombinedStreamingDataset(_litdata_datasets(workdir), seed=0, weights=[WEIGHTS[p] for p in PARTS],
                                        iterate_over_all=False)
    return CombinedStreamingDataset(_litdata_datasets(workdir), seed=0, iterate_over_all=True)


def _read_sources(system: str, workdir: str):
    """What one measurement iterates: a list of iterables, read one after the other."""
    buffer = 0 if system.endswith("unbuffered") else BUFFER
    if system == "wdsprep-alone-in-turn":
        return [_in_turn(workdir)]
    if system.endswith("one-part"):  # the first part alone, and a mix of it alone: what the mix's own code costs
        return [_one_part(workdir, mixed=system.startswith("wdsprep-mix"))]
    if system.startswith("wdsprep-alone"):
        return [_part_dataset(workdir, part, buffer) for part in PARTS]
    if system == "wdsprep-mix-sized" or system in SCHEDULES:
        return [_wdsprep_mix(workdir, weighted=True, buffer=buffer, scheduled=SCHEDULES.get(system, False))]
    if system.startswith("wdsprep-mix"):
        return [_wdsprep_mix(workdir, weighted=system.endswith("weighted"), buffer=buffer)]
    if system == "litdata-alone":
        return _litdata_datasets(workdir)
    return [_litdata_combined(workdir, weighted=system.endswith("weighted"))]


def _part_dataset(workdir: str, part: str, buffer: int):
    """One part's `wdsprep.dataset`, read alone: shuffled with `buffer`, decoded in its reader."""
    import wdsprep

    return wdsprep.dataset(os.path.join(workdir, "wdsprep", part, "manifest.json"), "train", seed=0,
                           shuffle_buffer=buffer, equalize=None).compose(wdsprep.decode(strip=True))


def _in_turn(workdir: str):
    """The parts' datasets as read alone, each with the mix's share of the buffer (571, 286, 143 of
    1,000: `MixDataset.part_buffers`), read in turn in the mix's order of parts (rule M5, slots
    unpermuted) by C iterators alone: no Python frame between the reader and the consumer. What three
    shuffled readers taking turns cost the hardware, without a mix."""
    from wdsprep.stream.mix import interleave

    mix = _wdsprep_mix(workdir, weighted=False)
    buffers = mix.part_buffers()[0]
    readers = [iter(_part_dataset(workdir, part, buffer)) for part, buffer in zip(PARTS, buffers)]
    order = [part for run in interleave(list(PARTS.values())) for part in run]
    return map(next, map(readers.__getitem__, order))


def _one_part(workdir: str, mixed: bool):
    """The first part's dataset (shuffle buffer 1,000), or a mix of that part only (epochized, repeat
    1, the same buffer): the same samples in the same order, one part, so nothing interleaves."""
    import wdsprep

    if mixed:
        return wdsprep.mix(_wdsprep_parts(workdir, repeat=dict.fromkeys(PARTS, 1))[:1], mode="epochized", seed=0,
                           shuffle_buffer=BUFFER, equalize=None)
    return _part_dataset(workdir, next(iter(PARTS)), BUFFER)


def _identity(sample: dict) -> tuple[str, int]:
    meta = sample["meta"]
    if not isinstance(sample["array"], np.ndarray) or sample["array"].shape != (ELEMENTS,):
        raise TypeError("a sample was not decoded to its array")
    return meta["part"], int(meta["index"])


def _read_once(system: str, workdir: str) -> dict:
    sources = _read_sources(system, workdir)
    counts: collections.Counter = collections.Counter()
    cpu, wall = _cpu(), time.perf_counter()
    for source in sources:
        for sample in source:
            counts[_identity(sample)[0]] += 1
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    total = sum(counts.values())
    return {"samples": total, "per_part": dict(counts), "cpu_us": cpu / max(total, 1) * 1e6, "rate": total / wall}


def read(system: str, workdir: str) -> dict:
    """Two passes in this fresh process, each of datasets made anew (so each plans its epoch): the
    first (`first_us`) pays the process's one-time costs (lazy imports, first touches); the second is
    the measurement (`cpu_us`, `rate`), what every later epoch of a training run costs."""
    first = _read_once(system, workdir)
    return {**_read_once(system, workdir), "first_us": first["cpu_us"]}


def alternated(system: str, base: str, workdir: str, pairs: int) -> dict:
    """`pairs` rounds in this one process, each a pass of `system` and one of `base`, in turn first
    (after a first pass of each, which pays the one-time costs): each round's ratio of their CPU per
    sample, `system` ÷ `base`."""
    _read_once(base, workdir)
    _read_once(system, workdir)
    ratios = []
    for round_ in range(pairs):
        order = (base, system) if round_ % 2 == 0 else (system, base)
        cpu = {name: _read_once(name, workdir)["cpu_us"] for name in order}
        ratios.append(cpu[system] / cpu[base])
    return {"ratios": ratios}


# ------------------------------------------------------------------------------------------ resume
def _collate(batch: list) -> list:
    return [_identity(sample) for sample in batch]


def _resume_loader(system: str, workdir: str, workers: int):
    if system == "wdsprep":
        import wdsprep

        return wdsprep.Loader(_wdsprep_mix(workdir, weighted=True), batch_size=RESUME_BATCH, num_workers=workers,
                              collate_fn=_collate)
    from litdata import StreamingDataLoader

    return StreamingDataLoader(_litdata_combined(workdir, weighted=True), batch_size=RESUME_BATCH,
                               num_workers=workers, collate_fn=_collate)


def resume(system: str, workdir: str, workers: int) -> dict:
    """The uninterrupted epoch, then: stop after a third of its batches, save, resume in a fresh loader."""
    whole = [tuple(item) for batch in _resume_loader(system, workdir, workers) for item in batch]
    again = [tuple(item) for batch in _resume_loader(system, workdir, workers) for item in batch]
    batches = max(1, len(whole) // RESUME_BATCH // 3)
    loader = _resume_loader(system, workdir, workers)
    iterator = iter(loader)
    head = [tuple(item) for _, batch in zip(range(batches), iterator) for item in batch]
    state = loader.state_dict()
    del iterator
    resumed = _resume_loader(system, workdir, workers)
    resumed.load_state_dict(state)
    rest = [tuple(item) for batch in resumed for item in batch]
    expected, got = collections.Counter(whole), collections.Counter(head + rest)
    return {"whole": len(whole), "repeatable": again == whole, "head": len(head), "rest": len(rest),
            "head_matches": head == whole[: len(head)],
            "exact": head + rest == whole, "missing": sum((expected - got).values()),
            "repeated": sum((got - expected).values())}


def child(job: dict) -> dict:
    if job["task"] == "read":
        return read(job["system"], job["workdir"])
    if job["task"] == "alternated":
        return alternated(job["system"], job["base"], job["workdir"], job["pairs"])
    return resume(job["system"], job["workdir"], job["workers"])


def _spawn(job: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, "child", json.dumps(job)], capture_output=True, text=True,
                            timeout=1800, env=_child_env())
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": last[:160]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _litdata_missing() -> str | None:
    probe = subprocess.run([sys.executable, "-c", "import litdata"], capture_output=True, text=True)
    return None if probe.returncode == 0 else "not installed (`make bench` installs the bench extra)"


def run(workdir: pathlib.Path) -> str:
    missing = _litdata_missing()
    for part, count in PARTS.items():
        files = workdir / "files" / part
        shutil.rmtree(files, ignore_errors=True)
        write_sample_files(files, _samples(part, count), prefix=part)  # what `wdsprep convert generic` reads
        shutil.rmtree(workdir / "wdsprep" / part, ignore_errors=True)
        convert_files(str(files), str(workdir / "wdsprep" / part), SHARD_BYTES)
        if not missing:
            shutil.rmtree(workdir / "litdata" / part, ignore_errors=True)
            write_litdata(workdir / "litdata" / part, part, count)
    shards = {part: len(json.loads((workdir / "wdsprep" / part / "manifest.json").read_text())["splits"]["train"]["shards"])
              for part in PARTS}
    rounds: dict = collections.defaultdict(list)
    for _ in range(REPEATS):
        for system in READS:  # interleaved: every system once per round
            rounds[system].append({"error": missing} if missing and system.startswith("litdata") else
                                  _spawn({"task": "read", "system": system, "workdir": str(workdir)}))
    reads = best_and_paired(rounds, BASELINE, str(workdir))
    resumes = {}
    for system in ("wdsprep", "litdata"):
        for workers in (0, 2):
            resumes[system, workers] = ({"error": missing} if missing and system == "litdata" else
                                        _spawn({"task": "resume", "system": system, "workdir": str(workdir),
                                                "workers": workers}))
    return _table(reads, resumes, shards)


NAMES = {
    "wdsprep-alone": "wdsprep, each part's `wdsprep.dataset` alone",
    "wdsprep-mix": "wdsprep, `wdsprep.mix` epochized, repeat 1",
    "wdsprep-alone-unbuffered": "wdsprep, each part alone, no shuffle buffer",
    "wdsprep-mix-unbuffered": "wdsprep, `wdsprep.mix` epochized, repeat 1, no shuffle buffer",
    "wdsprep-mix-weighted": "wdsprep, `wdsprep.mix` weighted 3:2:1, stop=\"all\"",
    "wdsprep-mix-sized": "wdsprep, `wdsprep.mix` weighted 3:2:1, samples_per_epoch = the parts' sizes",
    "wdsprep-mix-scheduled": "wdsprep, `wdsprep.mix` by a schedule of 4 phases, the same samples_per_epoch "
                             "(against the row above)",
    "wdsprep-mix-scheduled-16": "wdsprep, `wdsprep.mix` by a schedule of 16 phases, each its own weights, the same "
                                "samples_per_epoch (against the row two above)",
    "litdata-alone": "LitData, each part's `StreamingDataset` alone",
    "litdata-combined": "LitData, `CombinedStreamingDataset`, iterate_over_all",
    "litdata-combined-weighted": "LitData, `CombinedStreamingDataset`, weights 3:2:1",
}


def best_and_paired(rounds: dict, baseline: dict, workdir: str, pairs: int | None = None, processes: int = 1) -> dict:
    """Each system's best round (lowest CPU per sample; an error only where no round measured), with
    `paired`: the ratios of `alternated` passes of it and its baseline (none where either has no
    measurement), `pairs` of them (else PAIRS, SCHEDULE_PAIRS for a schedule) in each of `processes`
    fresh processes one after the other, pooled; and, of several, `process_medians`: each one's
    median ratio (a process's memory layout moves its median by about a point)."""
    reads = {}
    for system, results in rounds.items():
        measured = [result for result in results if "error" not in result]
        reads[system] = dict(min(measured, key=lambda result: result["cpu_us"])) if measured else results[0]
    for system, base in baseline.items():
        if "error" in reads[system] or "error" in reads[base]:
            continue
        count = pairs or (SCHEDULE_PAIRS if system in SCHEDULES else PAIRS)
        results = [_spawn({"task": "alternated", "system": system, "base": base, "workdir": workdir, "pairs": count})
                   for _ in range(processes)]
        if all("ratios" in result for result in results):
            reads[system]["paired"] = [ratio for result in results for ratio in result["ratios"]]
            if processes > 1:
                reads[system]["process_medians"] = [statistics.median(result["ratios"]) for result in results]
    return reads


def overhead(ours: dict | None, base: dict | None) -> str:
    """Best ÷ best - 1, and the median of the alternated pairs' ratios - 1 with their quartiles."""
    if not (ours and "cpu_us" in ours and base and "cpu_us" in base):
        return "n/a"
    paired = "n/a"  # no alternated passes measured both
    if ours.get("paired"):
        ratios = ours["paired"]  # PAIRS (or as many as asked for) in each process measured, at least two
        low, _, high = statistics.quantiles(ratios, n=4)
        paired = f"{(statistics.median(ratios) - 1) * 100:+.1f}%, {(low - 1) * 100:+.0f}..{(high - 1) * 100:+.0f}%"
        if ours.get("process_medians"):
            medians = sorted(ours["process_medians"])
            paired += f"; processes' medians {(medians[0] - 1) * 100:+.1f}..{(medians[-1] - 1) * 100:+.1f}%"
    return f"{(ours['cpu_us'] / base['cpu_us'] - 1) * 100:+.1f}% ({paired})"


def _phase_start_cost(reads: dict, system: str) -> float | None:
    """Milliseconds of CPU a pass of `system` (a scheduled mix) spends over its baseline (the median
    of the alternated pairs), per phase after the first; None where not measured."""
    ours, base = reads.get(system) or {}, reads.get(BASELINE[system]) or {}
    if not ours.get("paired") or "cpu_us" not in base:
        return None
    extra_us = (statistics.median(ours["paired"]) - 1) * base["cpu_us"] * ours["samples"]
    return extra_us / 1000 / (len(SCHEDULES[system]) - 1)


def _schedule_words() -> str:
    return ", ".join(f"from {start}: {':'.join(map(str, weights))}" for start, weights in SCHEDULE)


def _table(reads: dict, resumes: dict, shards: dict) -> str:
    sizes = ", ".join(f"{part}: {count:,} samples in {shards[part]} shards" for part, count in PARTS.items())
    lines = [
        "## mix: `wdsprep.mix` against its parts alone, and LitData `CombinedStreamingDataset`",
        "",
        f"Three parts of 4 KiB float32 arrays + a dict ({sizes}), converted by `wdsprep convert generic "
        f"--codec none --shard-bytes {SHARD_BYTES}`; LitData's copies written by its `BinaryWriter`. Read in one "
        f"process (no workers), each sample decoded to an array and a dict, shuffle buffer {BUFFER:,} for wdsprep "
        "unless the row says none; "
        f"best of {REPEATS} interleaved runs, each in a fresh process, CPU of its second pass (datasets made anew; "
        "the first pass, which pays the process's one-time costs, beside). Overhead: CPU per sample ÷ the same "
        "system's parts read alone, - 1 (the goal for wdsprep.mix: at most +5%); for the scheduled mix, ÷ the "
        f"same mix without a schedule, - 1 (the goal: at most +2%; schedule {_schedule_words()}): best ÷ best, and "
        f"in brackets the median, then the quartiles, of the ratios of {PAIRS} pairs of passes in one process "
        f"({SCHEDULE_PAIRS} for the schedules, whose goal is a smaller difference) "
        "(each a pass of the row's read and one of its baseline, in turn first), which the machine's drift "
        "between processes moves less.",
        "",
        "| reading | samples | samples/s (wall) | CPU µs/sample | overhead (alternated pairs: median, quartiles) | first pass µs/sample |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for system in READS:
        result = reads.get(system) or {}
        if "error" in result:
            lines.append(f"| {NAMES[system]} | n/a | n/a | n/a | {result['error']} | n/a |")
            continue
        over = overhead(result, reads.get(BASELINE[system])) if system in BASELINE else "—"
        lines.append(f"| {NAMES[system]} | {result['samples']:,} | {result['rate']:,.0f} | {result['cpu_us']:.2f} "
                     f"| {over} | {result['first_us']:.1f} |")
    starts = [_phase_start_cost(reads, system) for system in SCHEDULES]
    if all(cost is not None for cost in starts):  # (a cost of 0 or less is a measurement too)
        lines += ["", "A scheduled mix's CPU over the same mix without one, per phase start (the alternated median's "
                      "extra CPU of a pass ÷ the phases after the first): "
                  + "; ".join(f"{len(SCHEDULES[system])} phases: {cost:.2f} ms" for system, cost in zip(SCHEDULES, starts))
                  + "."]
    lines += [
        "",
        f"Resume of the weighted 3:2:1 mix (`wdsprep.Loader` / LitData `StreamingDataLoader`, batch {RESUME_BATCH}): "
        "the uninterrupted epoch, then a fresh loader resumed from the state saved after a third of its batches, "
        "compared by sample identity.",
        "",
        "| system | workers | epoch samples | a second run the same | before the stop | after the resume "
        "| exact (same rest, same order) | missing | repeated |",
        "|---|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for (system, workers), result in resumes.items():
        name = "wdsprep.mix" if system == "wdsprep" else "LitData CombinedStreamingDataset"
        if "error" in result:
            lines.append(f"| {name} | {workers} | n/a | n/a | n/a | n/a | {result['error']} | n/a | n/a |")
            continue
        exact = "yes" if result["exact"] else ("no" + ("" if result["head_matches"] else " (nor the run up to the stop)"))
        same = "yes" if result["repeatable"] else "no"
        lines.append(f"| {name} | {workers} | {result['whole']:,} | {same} | {result['head']:,} | {result['rest']:,} | {exact} "
                     f"| {result['missing']:,} | {result['repeated']:,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "child":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        print(json.dumps(child(json.loads(sys.argv[2]))))
