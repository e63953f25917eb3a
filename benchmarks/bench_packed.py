"""Packed members (issue 48): the bytes of a small sample, and the read CPU of packed shards.

Bytes. The same samples written by each system, every file of the dataset counted (shards, indexes,
manifests, sample and shard tables; MDS's `index.json`, LitData's `index.json`): S256 is a 256-byte
value (uint8[256]) and an int label, 20,000 samples; S64K a 64 KiB value and an int label, 300
samples. wdsprep's are files in the generic source's layout (`train/<key>.data.npy` +
`<key>.label.json`) converted by the command line, `wdsprep convert generic FILES OUT --codec none`,
with and without `--pack`; MDS's by its `MDSWriter` (`{"data": "bytes", "label": "int"}`), LitData's
by its `BinaryWriter` (`{"data": bytes, "label": int}`), uncompressed. Goals: packed S256 at most
1.2x MDS's bytes; packed S64K at most 1.05x unpacked (big samples are not packed).

Mixing. bench_mix.py's three parts (4 KiB float32 + a dict), converted with `--pack`, read alone
and mixed (`wdsprep.mix` epochized, repeat 1) with bench_mix's own reads, with a shuffle buffer of
1,000 and none. Goal: the mix at most 5% over its parts alone with the buffer. Beside them, the parts
alone read in turn (bench_mix `_in_turn`: each part's dataset with the mix's share of the buffer, taken
in the mix's order of parts by C iterators, no mix and no Python frame between): what the hardware
charges for three shuffled readers taking turns, against the same parts read one after another; and a
mix of the first part only against that part's dataset (the same samples in the same order): what the
mix's own code costs where nothing interleaves.

Read CPU. bench_peers.py's W3 (a 256-byte float32 array + a small dict, 20,000 samples), read as
bench_peers reads it (shuffled: wdsprep's shard permutation and 1,000-sample buffer, LitData
`shuffle=True`; decoded to an array and a dict; one process, and a 2-worker DataLoader with batch
64), from wdsprep's packed and unpacked conversions and LitData's `BinaryWriter` chunks. Each cell is
the best of the repeats, each run in a fresh process, the systems interleaved; CPU counts the process
and its workers, in the second of two passes (a reader made anew): the first pays the process's
one-time costs (lazy imports, first touches) and is shown beside; the same holds for the mix rows. Goal: packed at most 0.5x LitData's CPU per sample, in both modes.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

import bench_mix
import bench_peers
from _smoke import sized

HERE = pathlib.Path(__file__).resolve().parent
SIZES = {"S256": (256, sized(20_000, 300)), "S64K": (64 << 10, sized(300, 20))}  # value bytes, samples
W3 = (64, sized(20_000, 300))  # bench_peers' W3: float32 elements, samples
REPEATS = sized(5, 1)
# the packed mix's overhead lies near its goal (5%): its median over 16 alternated pairs ranged +4.0..+6.1% in
# four runs of one tree, over 100 pairs in one process +4.2..+5.4% in eight: a process's memory layout moves it,
# so the pairs are spread over MIX_PROCESSES processes, MIX_PAIRS in each, and pooled
MIX_PAIRS = sized(25, 2)
MIX_PROCESSES = sized(6, 2)
MODES = ("single", "2 workers")
READERS = ("wdsprep-packed", "wdsprep", "litdata")


def _env() -> dict:
    src = str(HERE.parent / "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))


def _labelled(size: int, count: int):
    rng = np.random.default_rng(0)
    for i in range(count):
        yield i, rng.integers(0, 256, size, dtype=np.uint8), int(i % 10)


def _write_files(directory: pathlib.Path, size: int, count: int) -> None:
    train = directory / "train"
    train.mkdir(parents=True)
    for i, value, label in _labelled(size, count):
        np.save(train / f"s{i:07d}.data.npy", value)
        (train / f"s{i:07d}.label.json").write_text(json.dumps(label))


def _convert(files: pathlib.Path, out: pathlib.Path, *flags: str) -> None:
    command = [sys.executable, "-m", "wdsprep", "convert", "generic", str(files), str(out), "--codec", "none", "--quiet", *flags]
    result = subprocess.run(command, capture_output=True, text=True, env=_env())
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()[-300:]}")


def _write_mds(out: pathlib.Path, size: int, count: int) -> None:
    bench_peers._import_streaming()
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"data": "bytes", "label": "int"}, size_limit=64_000_000) as writer:
        for _, value, label in _labelled(size, count):
            writer.write({"data": value.tobytes(), "label": label})


def _write_litdata(out: pathlib.Path, size: int, count: int) -> None:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_bytes=64_000_000)
    for i, value, label in _labelled(size, count):
        writer.add_item(i, {"data": value.tobytes(), "label": label})
    writer.done()
    writer.merge()


def _dataset_bytes(directory: pathlib.Path) -> tuple[int, int]:
    """(bytes of every file under `directory`, files), the conversion's lock file aside."""
    files = [p for p in directory.rglob("*") if p.is_file() and p.name != ".wdsprep.lock"]
    return sum(p.stat().st_size for p in files), len(files)


def child(job: dict) -> dict:
    """One measurement in this process: a peer's write, or a read (CPU µs per sample)."""
    if job["task"] == "mix":
        return bench_mix.read(job["system"], job["directory"])
    if job["task"] == "write":
        {"mds": _write_mds, "litdata": _write_litdata}[job["system"]](pathlib.Path(job["directory"]), job["size"], job["samples"])
        return {}
    job = {**job, "system": "litdata" if job["system"] == "litdata" else "wdsprep"}
    first = bench_peers.child(job)  # pays this process's one-time costs (lazy imports, first touches)
    return {**bench_peers.child(job), "first_us": first["cpu_us"]}  # a loader made anew: what a later epoch costs


def _spawn(job: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, "child", json.dumps(job)], capture_output=True, text=True,
                            timeout=1800, env=_env())
    if result.returncode != 0:
        return {"error": ((result.stderr.strip().splitlines() or ["no output"])[-1])[:160]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _bytes_table(workdir: pathlib.Path) -> tuple[list[str], dict]:
    found: dict = {}
    for name, (size, count) in SIZES.items():
        files = workdir / name / "files"
        shutil.rmtree(workdir / name, ignore_errors=True)
        _write_files(files, size, count)
        for system, flags in (("wdsprep", ()), ("wdsprep --pack", ("--pack",))):
            out = workdir / name / system.replace(" --", "-")
            _convert(files, out, *flags)
            found[name, system] = _dataset_bytes(out)
        for system in ("mds", "litdata"):
            out = workdir / name / system
            result = _spawn({"task": "write", "system": system, "directory": str(out), "size": size, "samples": count})
            found[name, system] = result.get("error") or _dataset_bytes(out)
    lines = ["| samples | system | files | bytes | bytes per sample | ÷ MDS | ÷ wdsprep unpacked |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, (size, count) in SIZES.items():
        mds, plain = found[name, "mds"], found[name, "wdsprep"]
        for system in ("wdsprep", "wdsprep --pack", "mds", "litdata"):
            value = found[name, system]
            if isinstance(value, str):
                lines.append(f"| {name} | {system} | n/a | n/a | n/a | n/a | n/a |  <!-- {value} -->")
                continue
            total, files = value
            over_mds = f"{total / mds[0]:.2f}" if not isinstance(mds, str) else "n/a"
            lines.append(f"| {name} ({count:,}) | {system} | {files} | {total:,} | {total / count:,.1f} | {over_mds} | "
                         f"{total / plain[0]:.2f} |")
    return lines, found


def _read_table(workdir: pathlib.Path) -> list[str]:
    files = workdir / "W3" / "files"
    shutil.rmtree(workdir / "W3", ignore_errors=True)
    bench_peers.write_files(files, *W3)
    directories = {"wdsprep-packed": workdir / "W3" / "wdsprep-packed", "wdsprep": workdir / "W3" / "wdsprep",
                   "litdata": workdir / "W3" / "litdata"}
    _convert(files, directories["wdsprep-packed"], "--pack")
    _convert(files, directories["wdsprep"])
    written = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_peers; "
                              f"bench_peers._write_litdata({str(directories['litdata'])!r}, {W3[0]}, {W3[1]})"],
                             capture_output=True, text=True, env=_env())
    best: dict = {}
    for _ in range(REPEATS):
        for mode in MODES:
            for system in READERS:
                if system == "litdata" and written.returncode != 0:
                    best[mode, system] = {"error": written.stderr.strip().splitlines()[-1][:120]}
                    continue
                result = _spawn({"task": "read", "system": system, "mode": mode, "directory": str(directories[system])})
                kept = best.get((mode, system))
                if kept is None or "error" in kept or ("error" not in result and result["cpu_us"] < kept["cpu_us"]):
                    best[mode, system] = result
    lines = ["| mode | system | samples | samples/s (wall) | CPU µs/sample | ÷ LitData | first pass µs/sample |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        litdata = best.get((mode, "litdata"), {})
        for system in READERS:
            result = best[mode, system]
            if "error" in result:
                lines.append(f"| {mode} | {system} | n/a | n/a | n/a | n/a | n/a |")
                continue
            ratio = f"{result['cpu_us'] / litdata['cpu_us']:.2f}" if "cpu_us" in litdata else "n/a"
            lines.append(f"| {mode} | {system} | {result['samples']:,} | {result['rate']:,.0f} | {result['cpu_us']:.2f} | {ratio} "
                         f"| {result['first_us']:.1f} |")
    return lines


MIX_READS = ("wdsprep-alone", "wdsprep-alone-in-turn", "wdsprep-mix", "wdsprep-alone-unbuffered", "wdsprep-mix-unbuffered",
             "wdsprep-alone-one-part", "wdsprep-mix-one-part")


def _mix_table(workdir: pathlib.Path) -> list[str]:
    """bench_mix's parts (4 KiB float32 + a dict: packable) converted with `--pack`, read alone and
    mixed (epochized, repeat 1) by bench_mix's own reads, with a shuffle buffer of 1,000 and none."""
    root = workdir / "mix"
    for part, count in bench_mix.PARTS.items():
        files = root / "files" / part
        shutil.rmtree(files, ignore_errors=True)
        bench_mix.write_sample_files(files, bench_mix._samples(part, count), prefix=part)
        shutil.rmtree(root / "wdsprep" / part, ignore_errors=True)
        _convert(files, root / "wdsprep" / part, "--pack", "--shard-bytes", bench_mix.SHARD_BYTES)
    rounds: dict = {system: [] for system in MIX_READS}
    for _ in range(REPEATS):
        for system in MIX_READS:  # each mix right after its parts alone
            rounds[system].append(_spawn({"task": "mix", "system": system, "directory": str(root)}))
    # an alone read is its own baseline; the parts read in turn are measured against them read one after another
    alone_of = {system: "wdsprep-alone" if system.endswith("in-turn") else system.replace("mix", "alone")
                for system in MIX_READS}
    best = bench_mix.best_and_paired(rounds, {system: alone for system, alone in alone_of.items() if alone != system},
                                     str(root), pairs=MIX_PAIRS, processes=MIX_PROCESSES)
    lines = [("| reading (packed parts) | samples | CPU µs/sample | over its parts alone (alternated pairs: median, "
              "quartiles; processes' medians) | first pass µs/sample |"),
             "|---|---:|---:|---:|---:|"]
    for system in MIX_READS:
        result, alone = best[system], best[alone_of[system]]
        if "error" in result or "error" in alone:
            lines.append(f"| {system} | n/a | n/a | n/a | n/a |")
            continue
        over = "—" if alone_of[system] == system else bench_mix.overhead(result, alone)
        lines.append(f"| {system} | {result['samples']:,} | {result['cpu_us']:.2f} | {over} | {result['first_us']:.1f} |")
    return lines


def run(workdir: pathlib.Path) -> str:
    sizes, _ = _bytes_table(workdir)
    reads = _read_table(workdir)
    mixes = _mix_table(workdir)
    return "\n".join([
        "## packed members: small samples at MDS's bytes (issue 48)",
        "",
        "Bytes: every file of each dataset (shards, index, manifest, sample and shard tables; MDS's and LitData's "
        "`index.json`), the same samples: S256 a 256-byte uint8 value + an int label, S64K a 64 KiB value + an int "
        "label. wdsprep: `wdsprep convert generic FILES OUT --codec none` with and without `--pack`; MDS `MDSWriter` "
        "(`bytes`, `int`), LitData `BinaryWriter`, uncompressed. Goals: S256 packed ≤ 1.2x MDS; S64K packed ≤ 1.05x "
        "unpacked.",
        "",
        *sizes,
        "",
        f"Read CPU (bench_peers' W3: 256 B float32 + dict, {W3[1]:,} samples; shuffled, decoded; best of {REPEATS} "
        "interleaved runs in fresh processes, each's second pass). Goal: packed ≤ 0.5x LitData in both modes.",
        "",
        *reads,
        "",
        "Mixing packed parts (bench_mix's three parts of 4 KiB float32 + a dict, converted with `--pack`; "
        "`wdsprep.mix` epochized, repeat 1, against each part's `wdsprep.dataset` alone, by bench_mix's own reads; "
        f"best of {REPEATS}, each's second pass; in brackets the median and quartiles of {MIX_PAIRS} alternated "
        f"pairs of passes (as in *mix*) in each of {MIX_PROCESSES} fresh processes, pooled, then the range of the "
        "processes' own medians; `wdsprep-alone-in-turn`: the parts' datasets with the mix's "
        "shares of the buffer, taken in the mix's order of parts by C iterators, no mix between; "
        "`wdsprep-mix-one-part`: a mix of the first part only against that part's dataset, the same samples in "
        "the same order: the mix's own code, nothing interleaved). Goal: at most +5% with a shuffle buffer of "
        "1,000.",
        "",
        *mixes,
        "",
    ])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work/bench_packed")))
