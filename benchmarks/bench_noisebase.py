"""Noisebase: lockstep batches/s from shards vs noisebase's own loader from the zarr zips; bytes.

Same synthetic sampleset_v1 data (12 sequences x 16 frames, 64x64 crops, 32 stored samples, the
real format's layout and compression), same loader arguments (batch 4, samples 8 of 32, all nine
buffers, flip/rotate on), both loaders run in this process one after the other, 2 epochs after a
warm-up epoch, with num_workers 0 and 2, the two loaders' epochs interleaved (A B A B) so both
see the same machine load. Besides batches/s (wall clock, which on a shared box swings with other
load) the table gives CPU ms per batch (this process and its DataLoader workers), the steadier
measure of the work each loader does. The baseline is noisebase 1.1.1's
`TrainingSampleLoader_v1` when it is installed (`pip install --no-deps noisebase==1.1.1`, needs
zarr<3); otherwise `NativeZipLoader` below, which loads the way noisebase does (a ZipStore opened
per frame, zarr slices, numpy transforms, torch's default collate). Batches are checked equal first.
Run alone: `python benchmarks/bench_noisebase.py [WORKDIR]`.
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
import warnings

import numpy as np

from _smoke import sized

SEQUENCES, FRAMES, CROP, STORED = sized((12, 16, 64, 32), (8, 4, 64, 32))
ARGS = dict(seed=42, val_split=0.0, shuffle=True, batch_size=4, drop_last=True, flip_rotate=True, stage="train",
            samples=8, buffers=["normal", "motion", "depth", "w_normal", "w_motion", "w_position", "diffuse", "color",
                                "reference"])


def _src() -> dict:
    return dict(sequences=SEQUENCES, files="sampleset_v1/train/scene{index:04d}.zip", frames_per_sequence=FRAMES,
                crop=CROP, samples=STORED, rendering_height=1080, rendering_width=1920)


def native_loader(data_path: str, num_workers: int):
    """noisebase's own loader if installed, else the in-file equivalent."""
    try:
        from noisebase.loaders.torch import TrainingSampleLoader_v1
    except ImportError:
        return NativeZipLoader(data_path, num_workers=num_workers, **ARGS), "NativeZipLoader (noisebase-style)"
    return TrainingSampleLoader_v1(src=_src(), data_path=data_path, num_workers=num_workers, **ARGS), "noisebase 1.1.1"


class _ZipFrames:
    """Upstream's per-frame load: open the sequence's ZipStore for every frame, slice with zarr."""

    def __init__(self, root, positions, seeds, flip_rotate, buffers, samples):
        self.files = [os.path.join(root, _src()["files"].format(index=int(i))) for i in positions]
        self.seeds, self.flip_rotate, self.buffers, self.samples = seeds, flip_rotate, buffers, samples

    def __getitem__(self, index):
        import zarr

        from wdsprep.sources.noisebase.native import decode_rgbe, zip_store
        from wdsprep.sources.noisebase.projective import Orientation, log_depth, motion_vectors, screen_space_normal

        frame, sequence = index["idx"] % FRAMES, index["idx"] // FRAMES
        code = self.seeds.derive(index["epoch"]).integers(sequence, 0, 8) if self.flip_rotate else 7
        orient = Orientation(code, 1080, 1920, CROP)
        store = zip_store(self.files[sequence])
        ds = zarr.open_group(store=store, mode="r")

        def camera(f):
            return orient.camera(ds["camera_target"][f], ds["camera_up"][f], ds["camera_position"][f],
                                 ds["proj_mat"][f], ds["crop_offset"][f])

        forward, up, left, pos, offset, pv = camera(frame)
        out = {"view_proj_mat": pv, "camera_position": pos, "camera_forward": forward, "camera_up": up,
               "camera_left": left, "crop_offset": offset}
        if frame > 0:
            pf, pu, pl, pp, po, ppv = camera(frame - 1)
            out["prev_camera"] = {"view_proj_mat": ppv, "camera_position": pp, "camera_forward": pf, "camera_up": pu,
                                  "camera_left": pl, "crop_offset": po}
        else:
            out["prev_camera"] = out.copy()
        out["frame_index"] = (frame,)
        s = self.samples
        w_normal = np.ascontiguousarray(orient.array_view(ds["normal"][frame, ..., 0:s])).astype(np.float32)
        out["w_normal"], out["normal"] = w_normal, screen_space_normal(w_normal, forward, up, left)
        w_position = np.ascontiguousarray(orient.array_view(ds["position"][frame, ..., 0:s]))
        w_motion = np.ascontiguousarray(orient.array_view(ds["motion"][frame, ..., 0:s]))
        out["w_position"] = w_position
        if frame > 0:
            out["w_motion"] = w_motion
            out["motion"] = np.clip(motion_vectors(w_position, w_motion, pv, ppv, 1080, 1920), -5e3, 5e3)
        else:
            out["w_motion"], out["motion"] = np.zeros_like(w_motion), np.zeros_like(w_motion[0:2])
        out["depth"] = log_depth(w_position, pos)
        rgbe = np.ascontiguousarray(orient.array_view(ds["color"][frame, ..., 0:s]))
        out["color"] = decode_rgbe(rgbe, ds["exposure"][frame])
        out["diffuse"] = np.ascontiguousarray(orient.array_view(ds["diffuse"][frame, ..., 0:s])).astype(np.float32)
        out["reference"] = np.ascontiguousarray(orient.array_view(ds["reference"][frame]))
        store.close()
        return out


def NativeZipLoader(root, *, num_workers, seed, val_split, shuffle, batch_size, drop_last, flip_rotate, stage,
                    samples, buffers):
    import torch

    from wdsprep.sources.noisebase.loader import LockstepSampler, SeedTree, split_sequences

    seeds = SeedTree(seed)
    _, train = split_sequences(SEQUENCES, seed=seed, val_split=val_split, shuffle=shuffle, batch_size=batch_size)
    sampler = LockstepSampler(batch_size, FRAMES, len(train), shuffle=shuffle, drop_last=drop_last,
                              shuffle_fn=lambda epoch, order: seeds.shuffle(epoch, order))
    dataset = _ZipFrames(root, train, seeds, flip_rotate, buffers, samples)

    def collate(batch):
        out = torch.utils.data.default_collate(batch)
        out["frame_index"] = out["frame_index"][0][0]
        return out

    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                                       prefetch_factor=4 if num_workers else None)


def _prepare(workdir: pathlib.Path) -> tuple[str, str, float]:
    from wdsprep.conversion import convert
    from wdsprep.sources.noisebase.synth import synth

    native = workdir / "noisebase-native"
    out = workdir / "noisebase-shards"
    if not (native / "sampleset_v1" / "train" / f"scene{SEQUENCES - 1:04d}.zip").exists():
        synth(str(native), seed=11, size="small", sequences=SEQUENCES, frames=FRAMES, crop=CROP, samples=STORED)
    import shutil

    shutil.rmtree(out, ignore_errors=True)  # a fresh conversion, so its time means something
    started = time.perf_counter()
    convert("noisebase", str(native), str(out), shard_bytes="64MB", codec="zstd")
    return str(native), str(out), time.perf_counter() - started


def _live_children_cpu() -> float:
    """CPU seconds of this process's live children (persistent DataLoader workers), from /proc."""
    total, me, tick = 0.0, os.getpid(), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _cpu_seconds() -> float:
    """This process, its reaped children and its live children (workers), in CPU seconds."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _live_children_cpu()


def _measure(loaders: dict, epochs: int = 2) -> dict:
    """name -> (batches/s, CPU ms per batch) over `epochs` interleaved epochs after a warm-up one."""
    totals = {name: [0, 0.0, 0.0] for name in loaders}
    for name, loader in loaders.items():
        for _ in loader:  # warm-up: page cache, imports, first-use paths
            pass
    for _ in range(epochs):
        for name, loader in loaders.items():
            cpu, started, count = _cpu_seconds(), time.perf_counter(), 0
            for _ in loader:
                count += 1
            totals[name][0] += count
            totals[name][1] += time.perf_counter() - started
            totals[name][2] += _cpu_seconds() - cpu
    return {name: (count / wall, cpu / count * 1000) for name, (count, wall, cpu) in totals.items()}


def _bytes(path: str, suffix: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith(suffix))


def run(workdir: pathlib.Path) -> str:
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    from wdsprep.sources.noisebase import TrainingSampleLoader

    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    native, shards, convert_seconds = _prepare(workdir)

    rows = []
    baseline_name = None
    for workers in (0, 2):
        ours = TrainingSampleLoader(shards, num_workers=workers, **ARGS)
        theirs, baseline_name = native_loader(native, workers)
        if workers == 0:  # same batches, or the comparison means nothing
            import torch

            mine, reference = next(iter(ours)), next(iter(theirs))
            for key in ("color", "motion", "normal", "depth", "crop_offset"):
                assert torch.equal(mine[key], reference[key]), key
        measured = _measure({"baseline": theirs, "wdsprep": ours})
        rows.append((workers, measured["baseline"], measured["wdsprep"]))

    zip_bytes, shard_bytes = _bytes(native, ".zip"), _bytes(shards, ".tar")
    lines = [
        "## noisebase",
        "",
        f"{SEQUENCES} synthetic sampleset_v1 sequences x {FRAMES} frames, {CROP}x{CROP} crops, {STORED} stored samples; "
        f"loader: batch 4, samples 8, all 9 buffers, flip_rotate on, 2 epochs after a warm-up epoch. "
        f"Baseline: {baseline_name} reading the zarr zips. Shards: zstd level 3, converted in {convert_seconds:.1f} s.",
        "",
        "| num_workers | baseline batches/s | wdsprep batches/s | speed-up | baseline CPU ms/batch | wdsprep CPU ms/batch | CPU ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workers, (theirs_rate, theirs_cpu), (ours_rate, ours_cpu) in rows:
        lines.append(f"| {workers} | {theirs_rate:.2f} | {ours_rate:.2f} | {ours_rate / theirs_rate:.2f}x "
                     f"| {theirs_cpu:.1f} | {ours_cpu:.1f} | {theirs_cpu / ours_cpu:.2f}x |")
    lines += [
        "",
        "| bytes | zarr zips (Blosc lz4hc 9) | shards (zstd 3) | shards / zips |",
        "|---|---:|---:|---:|",
        f"| total | {zip_bytes:,} | {shard_bytes:,} | {shard_bytes / zip_bytes:.2f} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    print(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-work")))
