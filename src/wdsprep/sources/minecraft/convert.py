"""Native episodes -> shard samples: one sample per episode segment (or per window of a long one).

Plan reads every frame once: it checks it, collects the block names, and so fixes one global
block vocabulary (`tables["blocks"]`, id = position) before any unit is built. Units then store
voxels as ids into that vocabulary, which is why the shard bytes do not depend on the unit order,
the number of workers or the executor. Build reads the frames again (the input is read twice).

A gap in the frame numbers (or a frame dropped with `--on-error skip`) splits an episode into
segments; no pair is ever made across a segment boundary. A segment longer than
`window_frames` is cut into windows that share `window_overlap` frames, so that every pair with a
history of up to `window_overlap` frames lies whole inside one window.

A file of the input that is not a frame (outside a `creative:*` folder, not `*.npy`, hidden, a macOS
resource fork) is reported, not dropped without a word (`ctx.ignore`, the manifest's `problems`).
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ...errors import ConfigError, InputError
from ..base import Plan, PlanContext, Source, Unit, UnitContext, group_by_size
from .native import NativeTree, block_names, list_episodes, load_frame

log = logging.getLogger("wdsprep.minecraft")

FORMAT = "minecraft/1"
DEFAULT_WINDOW_FRAMES = 1024
DEFAULT_WINDOW_OVERLAP = 16
_TAR_OVERHEAD = 4 * 1024  # headers and padding of one sample's members, roughly
_ZSTD_RATIO = 16  # what zstd makes of block ids, conservatively (the real data: ~60)


def episode_key(name: str) -> str:
    """A shard-safe, stable key stem for an episode folder name: `creative:12` -> `creative_12`."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if len(safe) > 56:
        safe = safe[:44] + "_" + hashlib.sha1(name.encode()).hexdigest()[:11]
    return safe


def ordered_vocabulary(names: set[str]) -> list[str]:
    """Block names in id order: "air" first (id 0) when present, then the rest sorted."""
    rest = sorted(n for n in names if n != "air")
    return (["air"] if "air" in names else []) + rest


def id_dtype(vocabulary_size: int) -> np.dtype:
    if vocabulary_size <= 256:
        return np.dtype(np.uint8)
    if vocabulary_size <= 2**15:
        return np.dtype(np.int16)
    return np.dtype(np.int32)


def windows(length: int, window_frames: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) of the windows of a segment of `length` frames (one window if it fits)."""
    if window_frames <= 0 or length <= window_frames:
        return [(0, length)]
    spans, start = [], 0
    while True:
        stop = min(start + window_frames, length)
        spans.append((start, stop))
        if stop == length:
            return spans
        start = stop - overlap


def segments(frame_numbers: Sequence[int]) -> list[list[int]]:
    """Split sorted frame numbers into runs of consecutive numbers (index lists)."""
    runs: list[list[int]] = []
    for index, t in enumerate(frame_numbers):
        if runs and t == frame_numbers[runs[-1][-1]] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


@dataclass
class _EpisodeScan:
    frames: list  # (t, relpath, size, shape, block names) of the frames that load and check
    problems: list  # (item, InputError) of the frames that do not, for the plan's `skip_or_raise`


def _scan_episode(path: str, directory: str, frames: list) -> _EpisodeScan:
    """Read and check every frame of one episode (plan time)."""
    tree = NativeTree(path)
    scan = _EpisodeScan([], [])
    try:
        for t, relpath, size in frames:
            try:
                frame = load_frame(relpath, tree.read(relpath))
            except InputError as error:
                scan.problems.append((relpath, error))
                continue
            scan.frames.append((t, relpath, size, frame.voxel.shape, block_names(frame.voxel)))
    finally:
        tree.close()
    return scan


class MinecraftSource(Source):
    id = "minecraft"
    show_with = "wdsprep.sources.minecraft.show:show"  # `wdsprep show` draws the reader's sample (show.py)
    fingerprint = "content"  # plan reads every frame anyway; zip members are known by their CRC-32
    index_fields = ("meta.episode",)  # the sample table's field (selections: one episode, a few)

    # ------------------------------------------------------------------------------ options
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--window-frames", dest="window_frames", type=int, default=DEFAULT_WINDOW_FRAMES,
            help="cut episode segments longer than this into windows (0: never cut)",
        )
        parser.add_argument(
            "--window-overlap", dest="window_overlap", type=int, default=DEFAULT_WINDOW_OVERLAP,
            help="frames consecutive windows share; pairs with history_length <= this are all kept",
        )

    def check_options(self, options: dict) -> None:
        self._window_options(options)

    @staticmethod
    def _window_options(options: dict) -> tuple[int, int]:
        frames = int(options.get("window_frames", DEFAULT_WINDOW_FRAMES) or 0)
        overlap = int(options.get("window_overlap", DEFAULT_WINDOW_OVERLAP))
        if frames < 0:
            raise ConfigError(f"window_frames must be >= 0, got {frames}")
        if overlap < 1:
            raise ConfigError(f"window_overlap must be >= 1 (windows must share a frame), got {overlap}")
        if frames and overlap >= frames:
            raise ConfigError(f"window_overlap ({overlap}) must be smaller than window_frames ({frames})")
        return frames, overlap

    # ------------------------------------------------------------------------------ plan
    def plan(self, input: str, ctx: PlanContext) -> Plan:
        options = ctx.options
        window_frames, overlap = self._window_options(options)

        def report(item: str, problem: str | InputError) -> None:
            ctx.skip_or_raise(item, problem)
            log.warning("skipping %s: %s", item, problem)

        tree = NativeTree(input)
        try:
            listing = list_episodes(tree, report, ctx.ignore)
        finally:
            tree.close()
        names: set[str] = set()
        episodes = []
        input_bytes = 0
        for episode, scan in zip(listing, self._scan_all(tree.path, listing, ctx.core.workers)):
            for item, problem in scan.problems:
                report(item, problem)
            good = self._drop_odd_shapes(episode.directory, scan.frames, report)
            kept = {t for t, *_ in good}
            for t, _, size, _, frame_names in scan.frames:
                if t in kept:
                    names.update(frame_names)
                    input_bytes += size
            episodes.append((episode, [frame[:4] for frame in good]))

        vocabulary = ordered_vocabulary(names)
        keys = self._episode_keys([episode.name for episode, _ in episodes])
        config = {
            "format": FORMAT,
            "window_frames": window_frames,
            "window_overlap": overlap,
            "id_dtype": id_dtype(len(vocabulary)).name,
        }
        windows_out, episode_rows, gap_rows = [], [], []
        for index, (episode, good) in enumerate(episodes):
            numbers = [t for t, *_ in good]
            runs = segments(numbers)
            episode_rows.append({
                "episode": episode.name,
                "index": index,
                "key": keys[episode.name],
                "frames": len(good),
                "segments": [[numbers[run[0]], numbers[run[-1]]] for run in runs],
            })
            for before, after in zip(runs, runs[1:]):
                last, first = numbers[before[-1]], numbers[after[0]]
                log.warning("%s: frames %d..%d missing; episode split into segments", episode.directory, last + 1, first - 1)
                gap_rows.append({"episode": episode.name, "after": last, "before": first})
            for segment, run in enumerate(runs):
                frames = [good[i] for i in run]
                side = frames[0][3][0]
                for window, (start, stop) in enumerate(windows(len(frames), window_frames, overlap)):
                    part = frames[start:stop]
                    windows_out.append({
                        "key": f"{keys[episode.name]}-{part[0][0]:06d}",
                        "episode": episode.name,
                        "episode_index": index,
                        "segment": segment,
                        "window": window,
                        "new_from": 0 if window == 0 else overlap,
                        "first_frame": part[0][0],
                        "side": side,
                        "paths": [relpath for _, relpath, _, _ in part],
                        "bytes": sum(size for _, _, size, _ in part),
                    })

        dtype = id_dtype(len(vocabulary))
        ratio = _ZSTD_RATIO if ctx.core.codec == "zstd" else 1
        estimates = [
            _TAR_OVERHEAD + len(w["paths"]) * (w["side"] ** 3 * dtype.itemsize // ratio + 3) for w in windows_out
        ]
        groups = group_by_size(windows_out, estimates, ctx.core.shard_bytes)
        units = []
        for number, group in enumerate(groups):
            items = [{**w, "input": tree.path, "blocks": vocabulary} for w in group]
            units.append(Unit(split="train", index=number, items=items, input_bytes=sum(w["bytes"] for w in group)))
        tables = {"blocks": vocabulary, "episodes": episode_rows, "gaps": gap_rows}
        return Plan(units=units, config=config, input_bytes=input_bytes, tables=tables)

    @staticmethod
    def inputs(item: dict) -> list:
        """A window reads its frames: files of the input directory, or members of the input zip."""
        if os.path.isdir(item["input"]):
            return [os.path.join(item["input"], relpath) for relpath in item["paths"]]
        return [(item["input"], relpath) for relpath in item["paths"]]

    @staticmethod
    def _scan_all(path: str, listing: list, workers: int) -> Iterator["_EpisodeScan"]:
        """Scan episodes in order, in `workers` processes when asked (results keep episode order)."""
        tasks = [(path, episode.directory, episode.frames) for episode in listing]
        if workers <= 1 or len(tasks) <= 1:
            yield from (_scan_episode(*task) for task in tasks)
            return
        from ...executors import process_pool  # workers that leave Ctrl-C to the driver

        with process_pool(min(workers, len(tasks))) as pool:
            yield from pool.map(_scan_episode, *zip(*tasks))

    @staticmethod
    def _drop_odd_shapes(directory: str, good: list, report) -> list:
        """Frames of one episode must share one cube size: the most common one (earliest on a tie).

        `good` holds tuples (t, relpath, size, shape, ...)."""
        if not good:
            return good
        counts: dict[tuple, int] = {}
        for frame in good:
            counts[frame[3]] = counts.get(frame[3], 0) + 1
        expected = max(counts, key=lambda s: counts[s])  # dicts keep first-seen order: ties go to the earliest
        if len(counts) == 1:
            return good
        reference = next(frame[1] for frame in good if frame[3] == expected)
        kept = []
        for frame in good:
            if frame[3] != expected:
                report(frame[1], f"voxel has shape {frame[3]}, but the episode {directory} has {expected} "
                                 f"(e.g. {reference.rpartition('/')[2]}); mixed sizes within an episode")
            else:
                kept.append(frame)
        return kept

    @staticmethod
    def _episode_keys(names: list[str]) -> dict[str, str]:
        keys = {name: episode_key(name) for name in names}
        stems: dict[str, list[str]] = {}
        for name, key in keys.items():
            stems.setdefault(key, []).append(name)
        for key, clashing in stems.items():
            if len(clashing) > 1:  # e.g. creative:a.b and creative:a_b
                for name in clashing:
                    keys[name] = f"{key[:44]}_{hashlib.sha1(name.encode()).hexdigest()[:11]}"
        return keys

    # ------------------------------------------------------------------------------ build
    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        trees: dict[str, NativeTree] = {}
        try:
            for item in unit.items:
                tree = trees.get(item["input"]) or trees.setdefault(item["input"], NativeTree(item["input"]))
                yield item["key"], self._build_window(tree, item)
        finally:
            for tree in trees.values():
                tree.close()

    @staticmethod
    def _build_window(tree: NativeTree, item: dict) -> dict:
        vocabulary = item["blocks"]
        sorted_names = np.array(sorted(vocabulary))
        id_of_sorted = np.array([vocabulary.index(n) for n in sorted_names.tolist()], dtype=np.int64)
        dtype = id_dtype(len(vocabulary))
        side = item["side"]
        count = len(item["paths"])
        voxels = np.empty((count, side, side, side), dtype=dtype)
        actions = np.empty((count, 3), dtype=np.int8)
        for index, relpath in enumerate(item["paths"]):
            frame = load_frame(relpath, tree.read(relpath))
            if frame.voxel.shape != (side, side, side):
                raise InputError(f"{relpath}: voxel has shape {frame.voxel.shape}, expected {(side,) * 3} "
                                 "(the file changed since the conversion was planned)")
            position = np.searchsorted(sorted_names, frame.voxel).clip(0, len(sorted_names) - 1)
            if not np.array_equal(sorted_names[position], frame.voxel):
                unknown = sorted(set(np.unique(frame.voxel).tolist()) - set(vocabulary))
                raise InputError(f"{relpath}: block names {unknown} are not in the planned vocabulary "
                                 "(the file changed since the conversion was planned)")
            voxels[index] = id_of_sorted[position]
            actions[index] = frame.action
        meta = {
            "episode": item["episode"],
            "episode_index": item["episode_index"],
            "segment": item["segment"],
            "window": item["window"],
            "first_frame": item["first_frame"],
            "new_from": item["new_from"],
        }
        return {"voxels": voxels, "actions": actions, "meta": meta}

    # ------------------------------------------------------------------------------ finalize
    def finalize(self, plan: Plan, unit_tables: Sequence[dict]) -> dict:
        return dict(plan.tables)

    # ------------------------------------------------------------------------------ synth
    def synth(self, directory: str, seed: int, size: str) -> None:
        from .synth import synth

        synth(directory, seed=seed, size=size)


SOURCE = MinecraftSource()
