"""`TrainingSampleLoader`: noisebase's Sample Training Loader v1, fed from shards.

Same arguments, same batches (bit for bit), same epoch counting, DDP rule and checkpoint API as
`noisebase.loaders.torch.TrainingSampleLoader_v1`:

* sequences are split into validation and training sets by the reference's seeded shuffle
  (`n_val = max(round(N * val_split), batch_size)`), training sequences are reshuffled per epoch;
* batch f of a group holds frame f of the same B sequences (lockstep); a new group of sequences
  follows the last frame; under DDP each rank takes every R-th sequence and B / R per batch;
* flip/rotate orientation per (epoch, sequence) from the same seeds;
* `loader.batch_sampler.checkpoint(epoch, batch_idx)` (only at a sequence boundary),
  `loader.state_dict()`, `loader.load_state_dict(sd)`.

Instead of opening a zarr zip per frame, each worker reads the frames it needs out of the shards,
each frame checked against its shard's index before it is decoded (`_shardread.SequenceReader`, through
the `ShardAccess` that `wdsprep.MapDataset` reads with: indexes loaded at first use and kept, a
bounded number of shards open, Range requests over pooled connections remotely).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ...errors import ConfigError, ManifestError
from ...stream import load_manifest
from .native import BUFFERS, decode_rgbe
from ...stream.reading.access import ShardAccess
from ._shardread import SequenceReader
from .convert import frame_key
from .projective import Orientation, log_depth, motion_vectors, screen_space_normal

SPLIT = "train"


# ------------------------------------------------------------------------------------ seeding
class SeedTree:
    """noisebase's seeded numpy RNG helper: a base seed drawn from `seed`, offsets per use."""

    def __init__(self, seed):
        self.seed = np.random.default_rng(seed=seed).integers(2**31)

    def shuffle(self, offset, sequence: np.ndarray) -> None:
        np.random.default_rng(seed=self.seed + offset).shuffle(sequence)

    def split(self, offset, sequence: np.ndarray, fraction: float, shuffled: bool = True, smallest: int = 0):
        if shuffled:
            self.shuffle(offset, sequence)
        count = max(round(len(sequence) * fraction), smallest)
        return sequence[:count], sequence[count:]

    def integers(self, offset, *args):
        return np.random.default_rng(seed=self.seed + offset).integers(*args)

    def derive(self, offset) -> "SeedTree":
        return SeedTree(self.seed + offset)


def split_sequences(count: int, *, seed: int, val_split: float, shuffle: bool, batch_size: int):
    """(validation, training) sequence positions, as noisebase splits them."""
    positions = np.arange(count)
    return SeedTree(seed).split(-1, positions, val_split, shuffle, batch_size)


# ------------------------------------------------------------------------------------ sampler
class LockstepSampler:
    """Batch sampler yielding frame f of B sequences in lockstep (noisebase's `VideoSampler`).

    Yields lists of `{'epoch', 'idx'}` with `idx = local_sequence * frames + frame`. Rank and world
    size are read from `torch.distributed` at construction; each rank takes every R-th sequence
    of the epoch's order and `batch_size // R` sequences per batch.
    """

    def __init__(self, batch_size: int, frames_per_sequence: int, num_sequences: int, *, shuffle: bool = False,
                 drop_last: bool = False, get_epoch: Callable[[], int] | None = None,
                 shuffle_fn: Callable | None = None, rank: int | None = None, world_size: int | None = None):
        self.frames_per_sequence = frames_per_sequence
        self.num_sequences = num_sequences
        self.shuffle = shuffle
        self.shuffle_fn = shuffle_fn
        self.drop_last = drop_last
        self.rank, self.num_replicas = 0, 1
        if dist.is_available() and dist.is_initialized():
            self.rank, self.num_replicas = dist.get_rank(), dist.get_world_size()
        if rank is not None:
            self.rank = rank
        if world_size is not None:
            self.num_replicas = world_size
        self.max_sequence_idx = num_sequences // self.num_replicas * self.num_replicas
        self.batch_size = batch_size // self.num_replicas
        if self.batch_size < 1:
            raise ConfigError(f"batch_size {batch_size} is smaller than the world size {self.num_replicas}")
        self.start_epoch_idx = 0
        self.start_sequence_idx = 0
        self.cached_state: dict = {}
        self.epoch_idx = 0
        self.get_epoch = get_epoch if get_epoch is not None else (lambda: self.epoch_idx)

    def checkpoint(self, epoch: int, batch_idx: int) -> bool:
        """Cache a resumable state before batch `batch_idx` of `epoch`; only between sequences."""
        if batch_idx % self.frames_per_sequence != 0:
            return False
        sequence_idx = batch_idx // self.frames_per_sequence * self.batch_size * self.num_replicas
        self.cached_state = {"start_epoch_idx": epoch, "start_sequence_idx": sequence_idx}
        return True

    def epoch_order(self, epoch: int) -> np.ndarray:
        """This epoch's global order of local sequence positions (before the rank split)."""
        order = np.arange(self.num_sequences)
        if self.shuffle:
            if self.shuffle_fn is not None:
                self.shuffle_fn(epoch, order)
            else:
                np.random.default_rng(seed=epoch).shuffle(order)
        return order

    def __iter__(self):
        epoch = self.get_epoch()
        order = self.epoch_order(epoch)
        if epoch == self.start_epoch_idx:
            order = order[self.start_sequence_idx:]
        mine = order[self.rank:self.max_sequence_idx:self.num_replicas]
        while True:
            if len(mine) == 0 or (len(mine) < self.batch_size and self.drop_last):
                self.epoch_idx = max(self.epoch_idx, epoch + 1)
                return
            group, mine = mine[:self.batch_size], mine[self.batch_size:]
            for frame in range(self.frames_per_sequence):
                yield [{"epoch": epoch, "idx": sequence * self.frames_per_sequence + frame} for sequence in group]

    def __len__(self) -> int:
        # noisebase's count, quirks included (it ignores a resumed epoch's shorter length)
        count = self.num_sequences // self.num_replicas // self.batch_size
        if count // self.num_replicas % self.batch_size != 0 and not self.drop_last:
            count += 1
        return count * self.frames_per_sequence


# ------------------------------------------------------------------------------------ dataset
def unit_shards(manifest) -> dict[int, list[tuple[str, dict]]]:
    """unit -> [(shard URL, manifest row), ...] in order, from the manifest's train split."""
    rows = manifest.shards(SPLIT)
    units: dict[int, list[tuple[str, dict]]] = {}
    for row, url in zip(rows, manifest.shard_urls(SPLIT)):
        units.setdefault(row.get("unit"), []).append((url, row))
    return units


def sequence_segments(units: dict, entry: dict, where: str = "manifest") -> list[tuple[str, dict, int, int]]:
    """(shard URL, its row, samples before the sequence in it, its frames in it) for one table entry."""
    segments, start, first, end = [], 0, entry["first"], entry["first"] + entry["frames"]
    for url, row in units.get(entry["unit"], []):
        stop = start + row["samples"]
        if stop > first and start < end:
            segments.append((url, row, max(first - start, 0), min(stop, end) - max(start, first)))
        start = stop
    if sum(count for _, _, _, count in segments) != entry["frames"]:
        raise ManifestError(f"{where}: the shards of unit {entry['unit']} do not hold the {entry['frames']} frames "
                            f"of {entry['file']}")
    return segments


_MEMBERS = {  # buffer -> shard fields it needs
    "normal": ("normal",), "w_normal": ("normal",),
    "depth": ("position",), "w_position": ("position",), "motion": ("position", "motion"),
    "w_motion": ("motion",), "color": ("color",), "diffuse": ("diffuse",), "reference": ("reference",),
}


class FrameDataset(torch.utils.data.Dataset):
    """Map-style frames addressed like noisebase's dataset (`{'epoch', 'idx'}` dicts)."""

    def __init__(self, sequences: list[dict], segments: list[list], *, frames_per_sequence: int, crop: int,
                 rendering_height: int, rendering_width: int, seeds: SeedTree, flip_rotate: bool,
                 buffers: Sequence[str], samples: int, batch_size: int):
        self.sequences = sequences
        self.segments = segments
        self.frames_per_sequence = frames_per_sequence
        self.crop = crop
        self.height = rendering_height
        self.width = rendering_width
        self.seeds = seeds
        self.flip_rotate = flip_rotate
        self.buffers = list(buffers)
        self.samples = samples
        self.batch_size = batch_size
        wanted: dict = {}
        for buffer in self.buffers:
            for member in _MEMBERS[buffer]:
                wanted[member] = None if member == "reference" else samples
        self.wanted = wanted
        shards = {url: row for segments_of in segments for url, row, _, _ in segments_of}
        self.access = ShardAccess(list(shards), list(shards.values()))  # every frame is read through it
        self._pid = None

    def __len__(self) -> int:
        return len(self.sequences) * self.frames_per_sequence

    # -- per-process state: readers and a thread pool (never shared across a fork; the access keeps its own)
    def _state(self):
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._readers: dict[int, SequenceReader] = {}
            self._pool = None
        return self._readers

    def __getstate__(self) -> dict:  # for spawned workers: readers and threads stay here
        state = dict(self.__dict__)
        for name in ("_readers", "_pool"):
            state.pop(name, None)
        state["_pid"] = None
        return state

    def close(self) -> None:
        """Close open shards and stop the thread pool; both come back lazily if the dataset is read again."""
        if self._pid == os.getpid():
            self._readers.clear()
            pool, self._pool = getattr(self, "_pool", None), None
            if pool is not None:
                pool.shutdown(wait=False)
        access = getattr(self, "access", None)
        if access is not None:
            access.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _reader(self, sequence: int) -> SequenceReader:
        readers = self._state()
        reader = readers.get(sequence)
        if reader is None:
            entry = self.sequences[sequence]
            keys = [frame_key(entry["file"], frame) for frame in range(entry["frames"])]
            reader = readers[sequence] = SequenceReader(self.segments[sequence], entry["file"], keys, self.access)
        return reader

    def orientation(self, epoch: int, sequence: int) -> Orientation:
        code = self.seeds.derive(epoch).integers(sequence, 0, 8) if self.flip_rotate else 7
        return Orientation(code, self.height, self.width, self.crop)

    def __getitem__(self, index: dict) -> dict:
        return self._load(index, self._reader(index["idx"] // self.frames_per_sequence))

    def __getitems__(self, indices: list[dict]) -> list[dict]:
        readers = self._state()
        current = {index["idx"] // self.frames_per_sequence for index in indices}
        for sequence in [s for s in readers if s not in current]:  # the batch's sequences' readers stay
            readers.pop(sequence)
        out = _Prebatched(self._allocate(len(indices)))
        jobs = [(index, self._reader(index["idx"] // self.frames_per_sequence), slot)
                for slot, index in enumerate(indices)]
        if len(jobs) == 1:
            out.append(self._load(*jobs[0], out=out.block))
            return out
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(self.batch_size, 1), thread_name_prefix="wdsprep-noisebase")
        out.extend(self._pool.map(lambda job: self._load(*job, out=out.block), jobs))
        return out

    def _allocate(self, count: int) -> "_BatchBlock":
        """One block for the whole batch: buffers (frames write into their slot) and camera data.

        A single storage per batch (shared memory in a worker) instead of one per tensor: in a
        worker every storage is a shared-memory segment to create, send and map, per batch.
        """
        crop, samples = self.crop, self.samples
        channels = {"w_normal": 3, "normal": 3, "w_position": 3, "w_motion": 3, "motion": 2, "depth": 1,
                    "color": 3, "diffuse": 3}
        layout = []
        for buffer in self.buffers:
            shape = (count, 3, crop, crop) if buffer == "reference" else (count, channels[buffer], crop, crop, samples)
            layout.append((buffer, shape, torch.float32))
        for prefix in ("", "prev_camera."):
            layout += [(prefix + "view_proj_mat", (count, 4, 4), torch.float32)]
            layout += [(prefix + name, (count, 3), torch.float32)
                       for name in ("camera_position", "camera_forward", "camera_up", "camera_left")]
            layout += [(prefix + "crop_offset", (count, 2), torch.int32)]
        return _BatchBlock(layout)

    def _load(self, index: dict, reader: SequenceReader, slot: int | None = None,
              out: "_BatchBlock | None" = None) -> dict:
        frame_index = int(index["idx"] % self.frames_per_sequence)
        sequence = index["idx"] // self.frames_per_sequence
        orient = self.orientation(index["epoch"], sequence)
        arrays, meta = reader.read(frame_index, self.wanted)

        def camera(frame: int, values: dict):
            # kept on the reader: this frame's camera is the next frame's previous one
            key = (frame, orient.code)
            cached = reader.cameras.get(key)
            if cached is None:
                cached = camera_of(orient, values)
                if len(reader.cameras) > 4:
                    reader.cameras.clear()
                reader.cameras[key] = cached
            return cached

        return build_frame(arrays, meta, orient, self.buffers, frame_index, self.sequences[sequence]["file"],
                           self.height, self.width, camera=camera, out=out, slot=slot)


def build_frame(arrays: dict, meta: dict, orient: Orientation, buffers, frame_index: int, file: str,
                height: int, width: int, *, camera=None, out: "_BatchBlock | None" = None,
                slot: int | None = None) -> dict:
    """One training frame, exactly as noisebase's dataset builds it.

    `arrays` holds the shard members (per-sample arrays sample-major, already cut to `samples`),
    `meta` the frame's `meta.mp`. With `out`/`slot`, buffers are written into the batch slot.
    The operations, their order and the (C-contiguous) layouts they run on are noisebase's.
    """
    if camera is None:
        camera = lambda frame, values: camera_of(orient, values)  # noqa: E731

    def place(key, value, view=False):
        """Store a buffer: into the batch slot when there is one (one copy), else as an array."""
        if out is None or key not in out.arrays:
            return orient.array(value, np.float32) if view else value
        target = out.arrays[key][slot]
        np.copyto(target, orient.array_view(value) if view else value, casting="same_kind")
        return target

    forward, up, left, position, offset, view_proj = camera(frame_index, meta)
    frame = {
        "view_proj_mat": view_proj,
        "camera_position": position,
        "camera_forward": forward,
        "camera_up": up,
        "camera_left": left,
        "crop_offset": offset,
    }
    if frame_index > 0:
        p_forward, p_up, p_left, p_position, p_offset, prev_view_proj = camera(frame_index - 1, meta["prev"])
        frame["prev_camera"] = {
            "view_proj_mat": prev_view_proj,
            "camera_position": p_position,
            "camera_forward": p_forward,
            "camera_up": p_up,
            "camera_left": p_left,
            "crop_offset": p_offset,
        }
    else:
        frame["prev_camera"] = frame.copy()
    frame["frame_index"] = (frame_index,)
    frame["file"] = file

    if "w_normal" in buffers or "normal" in buffers:
        if "w_normal" in buffers:
            w_normal = place("w_normal", _sample_last(arrays["normal"]), view=True)
        else:
            w_normal = orient.array(_sample_last(arrays["normal"]), np.float32)
    if "w_normal" in buffers:
        frame["w_normal"] = w_normal
    if "normal" in buffers:
        frame["normal"] = place("normal", screen_space_normal(w_normal, forward, up, left))
    if "depth" in buffers or "motion" in buffers or "w_position" in buffers:
        if "w_position" in buffers:
            w_position = place("w_position", _sample_last(arrays["position"]), view=True)
        else:
            w_position = orient.array(_sample_last(arrays["position"]))
    if "motion" in buffers or "w_motion" in buffers:
        if "w_motion" in buffers and frame_index > 0:
            w_motion = place("w_motion", _sample_last(arrays["motion"]), view=True)
        else:
            w_motion = orient.array(_sample_last(arrays["motion"]))
    if "w_position" in buffers:
        frame["w_position"] = w_position
    if frame_index > 0:
        if "w_motion" in buffers:
            frame["w_motion"] = w_motion
        if "motion" in buffers:
            motion = motion_vectors(w_position, w_motion, view_proj, prev_view_proj, height, width)
            frame["motion"] = place("motion", np.clip(motion, -5e3, 5e3))
    else:
        if "w_motion" in buffers:
            frame["w_motion"] = place("w_motion", np.zeros_like(w_motion))
        if "motion" in buffers:
            frame["motion"] = place("motion", np.zeros_like(w_motion[0:2]))
    if "depth" in buffers:
        frame["depth"] = place("depth", log_depth(w_position, position))
    if "color" in buffers:
        exposure = np.asarray(meta["exposure"], dtype=np.float32)
        frame["color"] = place("color", decode_rgbe(orient.array(_sample_last(arrays["color"])), exposure))
    if "diffuse" in buffers:
        frame["diffuse"] = place("diffuse", _sample_last(arrays["diffuse"]), view=True)
    if "reference" in buffers:
        frame["reference"] = place("reference", arrays["reference"], view=True)
    return frame


def _sample_last(array: np.ndarray) -> np.ndarray:
    """Stored sample-major [S, C, H, W] -> the reference's [C, H, W, S] (a view)."""
    return np.moveaxis(array, 0, -1)


def camera_of(orient: Orientation, meta: dict):
    """(forward, up, left, position, crop_offset, view_proj) of a frame's stored camera."""
    return orient.camera(
        np.asarray(meta["camera_target"], dtype=np.float32),
        np.asarray(meta["camera_up"], dtype=np.float32),
        np.asarray(meta["camera_position"], dtype=np.float32),
        np.asarray(meta["proj_mat"], dtype=np.float32),
        np.asarray(meta["crop_offset"], dtype=np.int32),
    )


class _BatchBlock:
    """Batch tensors carved out of one storage; `arrays` are numpy views of the same memory."""

    def __init__(self, layout: list):
        self.tensors, self.arrays = {}, {}
        if torch.utils.data.get_worker_info() is None:
            for key, shape, dtype in layout:  # in-process: ordinary, independent tensors
                self.tensors[key] = torch.empty(shape, dtype=dtype)
                self.arrays[key] = self.tensors[key].numpy()
            return
        total = sum(int(np.prod(shape)) for _, shape, _ in layout)  # all 4-byte elements
        block = _new_tensor((total,), torch.float32)
        offset = 0
        for key, shape, dtype in layout:
            size = int(np.prod(shape))
            tensor = block[offset:offset + size].view(dtype).view(shape)
            self.tensors[key] = tensor
            self.arrays[key] = tensor.numpy()
            offset += size


class _Prebatched(list):
    """Frames of one batch whose buffers already sit in batch tensors (filled slot by slot)."""

    def __init__(self, block: _BatchBlock):
        super().__init__()
        self.block = block


def _batch_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    """Stack same-shaped arrays with one single-threaded numpy copy per frame.

    Same values as torch's `default_collate` (which stacks with `torch.stack`), but torch's
    intra-op threads make that stack very slow on a busy CPU; in a worker process the batch goes
    straight into shared memory, like `default_collate` does.
    """
    first = arrays[0]
    dtype = torch.from_numpy(first[:0] if first.ndim else first.reshape(1)[:0]).dtype
    out = _new_tensor((len(arrays), *first.shape), dtype)
    target = out.numpy()
    for index, array in enumerate(arrays):
        target[index] = array
    return out


def _new_tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor; in a DataLoader worker in shared memory (as `default_collate` does)."""
    if torch.utils.data.get_worker_info() is not None:
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(int(np.prod(shape)))
        return torch.empty(0, dtype=dtype).new(storage).resize_(shape)
    return torch.empty(shape, dtype=dtype)


def _collate(values: list):
    first = values[0]
    if isinstance(first, dict):
        return {key: _collate([value[key] for value in values]) for key in first}
    if isinstance(first, np.ndarray) and first.dtype.kind in "fiub":
        return _batch_tensor(values)
    return torch.utils.data.default_collate(values)


def collate_frames(batch: list[dict]) -> dict:
    """torch's default collate (same dtypes and values), with `frame_index` one 0-d int64 tensor
    (frames are in lockstep), as noisebase's `collate_fixes` gives it."""
    frame_index = batch[0]["frame_index"][0]
    block = batch.block if isinstance(batch, _Prebatched) else None

    def gather(values: list, path: str):
        if block is not None and path in block.tensors:
            tensor, target = block.tensors[path], block.arrays[path]
            for slot, value in enumerate(values):
                row = target[slot]
                if value.ctypes.data != row.ctypes.data:  # buffers were written in place already
                    row[...] = value
            return tensor
        if isinstance(values[0], dict):
            prefix = f"{path}." if path else ""
            return {key: gather([value[key] for value in values], prefix + key) for key in values[0]}
        return _collate(values)

    collated = {}
    for key in batch[0]:
        if key == "frame_index":
            collated[key] = torch.as_tensor(np.int64(frame_index))
        else:
            collated[key] = gather([frame[key] for frame in batch], key)
    return collated


# ------------------------------------------------------------------------------------- loader
class TrainingSampleLoader(torch.utils.data.DataLoader):
    """noisebase's `TrainingSampleLoader_v1`, reading a wdsprep noisebase manifest's shards.

    `manifest_url` is a local path, file://, http(s):// or s3:// URL of `manifest.json` (or of
    its directory). `stage` is "train" or "val"/"validation" (no shuffling, no augmentation).
    """

    def __init__(self, manifest_url: str, *, buffers: Sequence[str] = BUFFERS, samples: int = 8,
                 flip_rotate: bool = True, batch_size: int = 8, num_workers: int = 4, shuffle: bool = True,
                 drop_last: bool = True, val_split: float = 0.05, seed: int = 42, stage: str = "train",
                 get_epoch: Callable[[], int] | None = None, prefetch_factor: int | None = 4,
                 pin_memory: bool | None = None, persistent_workers: bool = True, rank: int | None = None,
                 world_size: int | None = None):
        unknown = [b for b in buffers if b not in BUFFERS]
        if unknown:
            raise ConfigError(f"unknown buffer(s) {', '.join(map(repr, unknown))} (known: {', '.join(BUFFERS)})")
        if stage not in ("train", "val", "validation"):
            raise ConfigError(f"stage must be 'train' or 'val'/'validation' (got {stage!r})")
        manifest = load_manifest(manifest_url)
        if manifest.source != "noisebase":
            raise ManifestError(f"{manifest.url}: holds source {manifest.source!r}, not 'noisebase'")
        table = manifest.tables.get("sequences")
        info = manifest.tables.get("sampleset")
        if not table or not info:
            raise ManifestError(f"{manifest.url}: no noisebase sequence table (re-convert with this wdsprep)")
        if samples < 1:
            raise ConfigError(f"samples must be at least 1 (got {samples})")
        if samples > info["samples"]:
            raise ConfigError(f"samples={samples} but the shards store {info['samples']} samples per pixel")
        self.manifest = manifest
        self.sampleset = info
        train = stage == "train"

        seeds = SeedTree(seed)
        val_positions, train_positions = split_sequences(len(table), seed=seed, val_split=val_split,
                                                         shuffle=shuffle, batch_size=batch_size)
        positions = train_positions if train else val_positions
        sequences = [table[int(p)] for p in positions]
        self.sequence_positions = positions
        units = unit_shards(manifest)

        sampler = LockstepSampler(batch_size, info["frames_per_sequence"], len(sequences),
                                  shuffle=shuffle and train, drop_last=drop_last, get_epoch=get_epoch,
                                  shuffle_fn=lambda epoch, order: seeds.shuffle(epoch, order),
                                  rank=rank, world_size=world_size)
        dataset = FrameDataset(
            sequences, [sequence_segments(units, entry, manifest.url) for entry in sequences],
            frames_per_sequence=info["frames_per_sequence"], crop=info["crop"],
            rendering_height=info["rendering_height"], rendering_width=info["rendering_width"],
            seeds=seeds, flip_rotate=flip_rotate and train, buffers=buffers, samples=samples,
            batch_size=sampler.batch_size,
        )
        super().__init__(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate_frames,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            # workers hold no epoch state (the epoch travels in every index), so they can live on:
            # no fork and re-open of the current sequences at every epoch
            persistent_workers=persistent_workers and num_workers > 0,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        )

    # -- resumable, like noisebase
    def state_dict(self) -> dict:
        return self.batch_sampler.cached_state

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict != {}:
            self.batch_sampler.start_epoch_idx = state_dict["start_epoch_idx"]
            self.batch_sampler.epoch_idx = state_dict["start_epoch_idx"]
            self.batch_sampler.start_sequence_idx = state_dict["start_sequence_idx"]
