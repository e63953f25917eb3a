"""Shard samples (episode windows) -> training pairs, the way upstream `MinecraftDataset` pairs frames.

Upstream pairs frame idx with idx+1 for idx in range(H-1, T-1) inside one episode, H being
`history_length`; the H-1 frames before idx are its history. `pairs` does the same inside one
episode segment, so a sample gives T-H pairs, and all arrays are tensors of block ids (names via
`vocabulary(manifest)`, text via `voxel_to_text` / `action_to_text`).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...shards.codec import decode_sample
from .convert import windows
from .native import ACTION_FIELDS, ACTION_NAMES

TASKS = ("frame_prediction", "action_recognition")


# ------------------------------------------------------------------------------------ vocabulary
class Vocabulary:
    """Block id <-> name, as kept in the manifest (`tables["blocks"]`, id = position)."""

    def __init__(self, names: Sequence[str]):
        self.names = tuple(names)
        self._ids = {name: index for index, name in enumerate(self.names)}
        if len(self._ids) != len(self.names):
            raise FormatError("block vocabulary has duplicate names")
        width = max((len(n) for n in self.names), default=1) or 1
        self._array = np.array(self.names, dtype=f"<U{width}")

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, block_id: int) -> str:
        return self.names[block_id]

    def __iter__(self):
        return iter(self.names)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} blocks: {', '.join(self.names[:5])}{', ...' if len(self) > 5 else ''})"

    def id(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(f"block {name!r} is not in the vocabulary") from None

    def decode(self, ids) -> np.ndarray:
        """Block ids (array or tensor) -> array of names, the same values the source frames held."""
        if isinstance(ids, torch.Tensor):
            ids = ids.cpu().numpy()
        return self._array[np.asarray(ids).astype(np.int64, copy=False)]

    def encode(self, names) -> np.ndarray:
        """Array of block names -> int64 array of ids (KeyError on an unknown name)."""
        names = np.asarray(names)
        lookup = np.vectorize(self.id, otypes=[np.int64])
        return lookup(names) if names.size else np.zeros(names.shape, np.int64)


def vocabulary(manifest: Any) -> Vocabulary:
    """The block vocabulary of a conversion: from a Manifest, its dict, or its path/URL (file or folder)."""
    tables = getattr(manifest, "tables", None)
    if tables is None and isinstance(manifest, dict):
        tables = manifest.get("tables", manifest)
    if tables is None:
        url = os.fspath(manifest)
        try:
            from ...stream import load_manifest

            tables = load_manifest(url).tables
        except ImportError:  # the streaming core is optional for local manifests
            path = os.path.join(url, "manifest.json") if os.path.isdir(url) else url
            with open(path, "rb") as handle:
                tables = json.load(handle)["tables"]
    if "blocks" not in tables:
        raise FormatError(f"manifest has no 'blocks' table (not a minecraft conversion?): {manifest!r:.100}")
    return Vocabulary(tables["blocks"])


# ------------------------------------------------------------------------------------ text
def _names(voxel, vocab) -> np.ndarray:
    if isinstance(voxel, torch.Tensor):
        voxel = voxel.cpu().numpy()
    voxel = np.asarray(voxel)
    if voxel.dtype.kind in "iub":
        if vocab is None:
            raise ValueError("voxel holds block ids: pass the vocabulary (wdsprep.minecraft.vocabulary(manifest))")
        vocab = vocab if isinstance(vocab, Vocabulary) else Vocabulary(vocab)
        return vocab.decode(voxel)
    return voxel


def voxel_to_text(voxel, vocabulary: Vocabulary | Sequence[str] | None = None, size: int = 5) -> str:
    """Upstream `voxel2word`: centre crop to size³ (an even size acts as size-1), then one
    `|name|name|...|` row per (y, x), z along the row, y outermost."""
    names = _names(voxel, vocabulary)
    side = names.shape[0]
    if side < size:
        raise ValueError(f"voxel side {side} is smaller than the text window {size}")
    half, centre = int((size - 1) / 2), int((side - 1) / 2)
    crop = names[centre - half : centre + half + 1, centre - half : centre + half + 1, centre - half : centre + half + 1]
    rows = crop.transpose(1, 0, 2).reshape(-1, crop.shape[2]).tolist()  # (y, x) rows of z
    return "".join("|" + "|".join(row) + "|\n" for row in rows)


def action_to_text(action) -> str:
    """Upstream `action2word`: "straight: forward\\npan: noop\\njump: jump\\n"."""
    if isinstance(action, torch.Tensor):
        action = action.cpu().numpy()
    values = [int(v) for v in np.asarray(action).reshape(-1)]
    if len(values) != 3:
        raise ValueError(f"an action has 3 values, got {values}")
    try:
        return "".join(f"{field}: {names[v]}\n" for field, names, v in zip(ACTION_FIELDS, ACTION_NAMES, values))
    except IndexError:
        raise ValueError(f"action {values} out of range") from None


# ------------------------------------------------------------------------------------ pairs
def _crop(voxels: torch.Tensor, crop: int | None) -> torch.Tensor:
    if crop is None:
        return voxels
    side = voxels.shape[-1]
    if side < crop:
        raise ConfigError(f"crop={crop} is larger than the stored voxel side {side}")
    half, centre = int((crop - 1) / 2), int((side - 1) / 2)
    s = slice(centre - half, centre + half + 1)
    return voxels[:, s, s, s]


def _pairs(source: Iterable[dict], task: str, history_length: int, crop: int | None,
           max_episodes: int | None) -> Iterator[dict]:
    for raw in source:
        sample = decode_sample(raw)
        meta = sample["meta"]
        if max_episodes is not None and meta["episode_index"] >= max_episodes:
            continue  # upstream keeps the first N episode folders (skipped ones count)
        new_from = meta["new_from"]
        if new_from and history_length > new_from:
            raise ConfigError(
                f"{sample['__key__']}: history_length={history_length} needs windows that overlap by at least "
                f"{history_length} frames; these shards overlap by {new_from} (convert with --window-overlap)"
            )
        voxels = _crop(torch.from_numpy(sample["voxels"]), crop)
        actions = torch.from_numpy(sample["actions"].astype(np.int64))
        frames, moves = voxels.unbind(0), actions.unbind(0)  # per-frame views, made once
        stem, episode, first_frame = sample["__key__"].rpartition("-")[0], meta["episode"], meta["first_frame"]
        first = max(history_length, new_from, 1)  # index of the first target frame in this window
        if history_length > 1 and len(frames) > first:
            # history h of input idx is frames idx-H+1 .. idx-1 = row idx-H+1 of these sliding views
            span = history_length - 1
            history_voxels = voxels.unfold(0, span, 1).permute(0, 4, 1, 2, 3).unbind(0)
            history_actions = actions.unfold(0, span, 1).permute(0, 2, 1).unbind(0)
        for target in range(first, len(frames)):
            idx = target - 1
            t = first_frame + idx
            pair = {"__key__": f"{stem}-{t:06d}", "episode": episode, "t": t, "voxel": frames[idx]}  # no bookkeeping
            if task == "frame_prediction":
                pair["action"] = moves[idx]
                pair["target"] = frames[target]
            else:
                pair["next_voxel"] = frames[target]
                pair["target"] = moves[idx]
            if history_length > 1:
                pair["history_start"] = t - history_length + 1
                pair["history_voxels"] = history_voxels[idx - span]
                pair["history_actions"] = history_actions[idx - span]
            yield pair


def pairs(task: str = "frame_prediction", history_length: int = 1, crop: int | None = None,
          max_episodes: int | None = None) -> Callable[[Iterable[dict]], Iterator[dict]]:
    """Reader stage: episode samples -> (frame t, action t, frame t+1) pairs.

    frame_prediction gives `voxel` and `action` with `target` = the next voxel; action_recognition
    gives `voxel` and `next_voxel` with `target` = the action. Each pair has `episode` ("creative:3")
    and `t` (frame number of `voxel`); with `history_length=H > 1` also `history_voxels` (H-1 frames
    before t), `history_actions` (their actions) and `history_start`. Targets run from index H-1 to
    T-2 of each segment like upstream. `crop=k` centre-crops every voxel to k³ like `voxel2word`;
    `max_episodes=N` keeps the first N episodes of the conversion (by folder name, like upstream's
    `max_creative_scenes`). Voxels are views of the stored ids (uint8 for <= 256 blocks).
    """
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r} (expected one of {', '.join(TASKS)})")
    if int(history_length) < 1:
        raise ConfigError(f"history_length must be >= 1, got {history_length}")
    if crop is not None and int(crop) < 1:
        raise ConfigError(f"crop must be >= 1, got {crop}")
    history_length = int(history_length)

    def stage(source: Iterable[dict]) -> Iterator[dict]:
        return _pairs(source, task, history_length, crop, max_episodes)

    return stage


# ------------------------------------------------------------------------------------ collate
def pair_counts(history_length: int = 1, max_episodes: int | None = None) -> Callable:
    """For `wdsprep.dataset(..., outputs_per_sample=pair_counts(...))`: the pairs that
    `pairs(history_length=H, max_episodes=N)` makes of each shard sample (episode window), from the
    manifest's episode table and window config (no shard is read), so ranks balance on pairs."""
    if int(history_length) < 1:
        raise ConfigError(f"history_length must be >= 1, got {history_length}")

    def counts(manifest, split: str) -> list[int]:
        window_frames, overlap = manifest.config["window_frames"], manifest.config["window_overlap"]
        out = []
        for row in sorted(manifest.tables["episodes"], key=lambda row: row["index"]):
            for first, last in row["segments"]:  # a segment is a run of consecutive frame numbers
                for number, (start, stop) in enumerate(windows(last - first + 1, window_frames, overlap)):
                    skipped = max_episodes is not None and row["index"] >= max_episodes
                    target = max(int(history_length), 0 if number == 0 else overlap, 1)
                    out.append(0 if skipped else max(0, stop - start - target))
        return out

    return counts


def collate(batch: Sequence[dict], device: str | torch.device | None = None,
            pin_memory: bool | None = None) -> dict:
    """Stack a list of pairs into a batch: tensors stacked, numbers as tensors, strings as lists.

    `device` moves the batch there (`"auto"`: CUDA when available, else stay on the CPU). When CUDA is
    available the batch is pinned (unless `pin_memory=False`), and copies to a device do not block.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else None
    device = torch.device(device) if device is not None else None
    pin = pin_memory if pin_memory is not None else torch.cuda.is_available()
    out: dict[str, Any] = {}
    for name in batch[0]:
        values = [item[name] for item in batch]
        first = values[0]
        if isinstance(first, torch.Tensor):
            value = torch.stack(values)
        elif isinstance(first, np.ndarray):
            value = torch.from_numpy(np.stack(values))
        elif isinstance(first, (int, np.integer)) and not isinstance(first, bool) and not name.startswith("__"):
            value = torch.tensor(values, dtype=torch.int64)
        else:
            out[name] = values
            continue
        if pin and torch.cuda.is_available():
            value = value.pin_memory()
        if device is not None:
            value = value.to(device, non_blocking=pin)
        out[name] = value
    return out


def collate_fn(device: str | torch.device | None = None, pin_memory: bool | None = None) -> Callable:
    """A picklable `collate` with its options bound, for DataLoader(collate_fn=...) or `.batched(...)`."""
    import functools

    return functools.partial(collate, device=device, pin_memory=pin_memory)


# ------------------------------------------------------------------------------------ map-style
class MinecraftPairs(torch.utils.data.Dataset):
    """Map-style drop-in for upstream `MinecraftDataset` (len, indexing, any sampler) over shards at
    any location.

    Reads every sample of `split` once, shard by shard, through `wdsprep.MapDataset` (each checked
    against its shard's index), and keeps the episodes as block ids (about 9 KB a 21³ frame), so
    `len` and `dataset[i]` are the same pairs, in the same order, as the `pairs` stage gives on the
    unshuffled shard list. `pair_options` are those of `pairs`; `vocabulary` gives the names.
    """

    def __init__(self, manifest: Any, split: str = "train", **pair_options: Any):
        from ...stream import load_manifest
        from ...stream.mapdataset import MapDataset

        if not hasattr(manifest, "shard_urls"):
            manifest = load_manifest(os.fspath(manifest))
        self.vocabulary = vocabulary(manifest)
        stage = pairs(**pair_options)
        episodes = MapDataset(manifest, split, decode=False)  # the split in manifest order, read and checked
        self._pairs = list(stage(raw for _, raws in episodes.by_shard() for raw in raws))

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, index: int) -> dict:
        return self._pairs[index]
