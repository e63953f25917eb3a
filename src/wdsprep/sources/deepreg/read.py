"""Reader stage: shard samples -> DeepReg's training sample dicts.

`pairs(kind, ...)` rebuilds what DeepReg's `GeneratorDataLoader.data_generator` followed by its
`resize_inputs` map yields: `moving_image`, `fixed_image`, (`moving_label`, `fixed_label`) and
`indices`, all float32, images min/max-normalised, everything linearly resized.

Pairing needs more than one shard sample (unpaired, grouped inter-group), so the stage works on
*blocks*: the consecutive samples of one shard (`__url__`), or `block_size` of them. A block is
sorted by DeepReg's index, then DeepReg's own sampling runs over it with a `random.Random` whose
seed comes only from (seed or epoch, first index of the block). Nothing crosses a shard boundary,
so replaying a shard from its start (the core's resume) gives the same outputs; and a split that
fits in one shard, read with an integer seed, gives exactly DeepReg's index sequence.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ...errors import ConfigError, DeepRegSamplingError
from ...shards.codec import decode_value, split_field
from ._sampling import (
    check_grouped_options,
    grouped_iterated,
    grouped_sampled,
    paired_order,
    unpaired_order,
)

KINDS = ("paired", "unpaired", "grouped")


# ----------------------------------------------------------------------- array operations
def normalize(array: np.ndarray) -> np.ndarray:
    """DeepReg's per-image min/max normalisation (v0.1.0+): constant image -> zeros, no EPS."""
    array = np.asarray(array, dtype=np.float32)
    low, high = array.min(), array.max()
    if low == high:
        return np.zeros_like(array)
    return (array - low) / (high - low)


def _axis_plan(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-pixel-centred linear interpolation along one axis, clamped at the edges."""
    position = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    position = np.clip(position, 0, size_in - 1)
    lower = np.floor(position).astype(np.intp)
    upper = np.minimum(lower + 1, size_in - 1)
    weight = (position - lower).astype(np.float32)
    return lower, upper, weight


def resize(volume: np.ndarray, shape: Iterable[int] | None) -> np.ndarray:
    """Separable linear resize of the first three axes (TF `resize` BILINEAR, half_pixel_centers).

    Unchanged when the shape already matches, as DeepReg's Resize3d.
    """
    if shape is None:
        return volume
    shape = tuple(int(s) for s in shape)
    if tuple(volume.shape[:3]) == shape:
        return volume
    out = np.asarray(volume, dtype=np.float32)
    for axis, size_out in enumerate(shape):
        size_in = out.shape[axis]
        if size_in == size_out:
            continue
        lower, upper, weight = _axis_plan(size_in, size_out)
        broadcast = [1] * out.ndim
        broadcast[axis] = size_out
        weight = weight.reshape(broadcast)
        low = np.take(out, lower, axis=axis)
        high = np.take(out, upper, axis=axis)
        out = low + (high - low) * weight
    return out


IDENTITY_SCALE = [1.0, 0.0]


def to_float32(array: np.ndarray, volume_meta: dict | None) -> np.ndarray:
    """The stored array as DeepReg reads it: NIfTI scaling applied, float32."""
    scale = (volume_meta or {}).get("scale")
    if scale and list(scale) != IDENTITY_SCALE:
        return (array.astype(np.float64) * scale[0] + scale[1]).astype(np.float32)
    return np.asarray(array, dtype=np.float32)


def stored_label(array: np.ndarray) -> np.ndarray:
    """A label as DeepReg holds it: a trailing channel of 1 squeezed (layout deepreg/2 stores every
    label 4-D; DeepReg's loaders squeeze a trailing 1, so a true (X, Y, Z, 1) label never reaches here)."""
    return array[..., 0] if array.ndim == 4 and array.shape[-1] == 1 else array


# ----------------------------------------------------------------------- sample access
class _Item:
    """A shard sample (raw bytes or decoded) whose members are decoded on demand."""

    __slots__ = ("sample", "members", "meta", "key", "url", "_groups")

    def __init__(self, sample: dict):
        self.sample = sample
        self.members = {split_field(name)[0]: name for name in sample if not name.startswith("__")}
        key = sample.get("__key__", "")
        self.key = key.decode() if isinstance(key, (bytes, bytearray)) else str(key)
        self.url = sample.get("__url__")
        meta = self.get("meta")
        if not isinstance(meta, dict) or "type" not in meta:
            raise ConfigError(f"sample {self.key!r}: no deepreg `meta` member; is this a deepreg shard?")
        self.meta = meta
        self._groups: dict[str, np.ndarray] = {}

    def get(self, field: str) -> Any:
        member = self.members.get(field)
        return None if member is None else decode_value(member, self.sample[member])

    def grouped(self, role: str, position: int) -> np.ndarray | None:
        """Volume `position` of this group's `role` ("image" or "label"), a fresh array: from the
        group member `<role>s` (stacked, or ragged with shapes in meta), or the older per-position
        member `<role>_<position:04d>`."""
        if role + "s" not in self.members:
            return self.get(f"{role}_{position:04d}")
        group = self._groups.get(role)
        if group is None:
            group = self._groups[role] = self.get(role + "s")
        if group.ndim > 1:
            return group[position].copy()
        shapes = [volume[role]["shape"] for volume in self.meta["volumes"]]
        start = sum(int(np.prod(shape)) for shape in shapes[:position])
        return group[start:start + int(np.prod(shapes[position]))].reshape(shapes[position]).copy()

    @property
    def order(self) -> int:
        return self.meta["group_index"] if self.meta["type"] == "grouped" else self.meta["index"]


def _in_multi_worker_loader() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return False
    info = get_worker_info()
    return info is not None and info.num_workers > 1


def _seed_int(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


class _Draws:
    """Where every random draw comes from: (seed or epoch) and the block / pair identity."""

    def __init__(self, seed: int | None, epoch: int):
        self.seed, self.epoch = seed, epoch

    def block(self, first_index: int) -> random.Random:
        if self.seed is not None and first_index == 0:
            return random.Random(self.seed)  # DeepReg's own stream for the split's first block
        base = ("seed", self.seed) if self.seed is not None else ("epoch", self.epoch)
        return random.Random(_seed_int(base, "block", first_index))

    def label(self, indices: tuple) -> random.Random:
        base = ("seed", self.seed) if self.seed is not None else ("epoch", self.epoch)
        return random.Random(_seed_int(base, "label", indices))


# ----------------------------------------------------------------------- the stage
class _Pairs:
    def __init__(self, kind: str, moving_shape, fixed_shape, labeled: bool, sample_label: str,
                 intra_group_prob: float, intra_group_option: str, sample_image_in_group: bool,
                 seed: int | None, epoch, block_size: int | None, shuffle: bool):
        self.kind = kind
        self.moving_shape, self.fixed_shape = moving_shape, fixed_shape
        self.labeled, self.sample_label = labeled, sample_label
        self.intra_group_prob, self.intra_group_option = intra_group_prob, intra_group_option
        self.sample_image_in_group = sample_image_in_group
        self.seed, self.epoch = seed, epoch
        self.block_size, self.shuffle = block_size, shuffle
        self._passes = 0  # iterations started over this stage (the epoch when nothing else says)
        self._manifests: dict = {}  # loaded by `_recover`, by shard directory

    # -- blocks
    def _block_of(self, item: _Item) -> tuple[tuple, int, int, int]:
        """(block identity, first position, length, this sample's position) from the converter's meta.

        The converter numbers the samples of each shard (`meta.block`); `block_size` cuts that
        further into fixed runs. Knowing a block's length lets the stage pair as soon as its last
        sample arrives, without reading ahead into the next block.
        """
        block = item.meta.get("block")
        if not block:
            return (item.url, None), 0, 0, 0  # no layout: the block ends when the shard (url) does
        position, size = block["position"], block["size"]
        start = 0
        if self.block_size:
            start = position - position % self.block_size
            size = min(self.block_size, size - start)
        return (item.url, block["id"], start), start, size, position

    def _recover(self, item: _Item, identity: tuple, start: int, position: int) -> list[_Item]:
        """The block's samples before `item`, re-read from the start of its shard, each checked
        against the shard's row in the manifest beside it before it is used (a shard no manifest
        there lists is a `ShardError`).

        Needed after a resume that skipped into the middle of a block (the core skips the samples
        it had pulled); the pairs then come out exactly as in the uninterrupted epoch. A stream
        may also legitimately start inside a shard: DataLoader workers split a shard between two
        neighbouring workers. Where the sample says where its piece starts (`__piece_start__`),
        only that part is re-read; without it, recovery is off inside a multi-worker DataLoader.
        """
        if not item.url:
            return []
        piece_start = item.sample.get("__piece_start__")
        if piece_start is not None:
            start = max(start, int(piece_start))
            if start >= position:
                return []
        elif _in_multi_worker_loader():
            return []
        from ...stream.manifests import shard_row
        from ...stream.reading.read import checked_samples

        found: list[_Item] = []
        for sample in checked_samples(item.url, shard_row(item.url, self._manifests)):
            other = _Item(sample)
            other_identity, _, _, other_position = self._block_of(other)
            if other.key == item.key or other_position >= position and other_identity == identity:
                break
            if other_identity == identity and other_position >= start:
                found.append(other)
        return found

    def _blocks(self, source: Iterable[dict]) -> Iterator[list[_Item]]:
        block: list[_Item] = []
        identity = None
        positions: set[int] = set()
        for sample in source:
            item = _Item(sample)
            if item.meta["type"] != self.kind:
                raise ConfigError(f"sample {item.key!r} is a {item.meta['type']} sample, but pairs() was "
                                  f"asked for {self.kind!r}")
            item_identity, start, size, position = self._block_of(item)
            if block and (item_identity != identity or position in positions):
                yield block  # an incomplete block (a piece cut short, or the shard ended)
                block, positions = [], set()
            if not block and position > start:
                block = self._recover(item, item_identity, start, position)
                positions = {self._block_of(b)[3] for b in block}
            block.append(item)
            positions.add(position)
            identity = item_identity
            if size and len(block) >= size:
                yield block
                block, positions = [], set()
        if block:
            yield block

    def _epoch_of(self, item: _Item) -> int:
        if callable(self.epoch):
            return int(self.epoch())
        if self.epoch is not None:
            return int(self.epoch)
        value = item.sample.get("__epoch__")
        if value is None:
            # plain webdataset: each pass over the pipeline calls the stage anew; count the passes
            # so that, as in DeepReg with seed=None, every epoch draws afresh
            return self._passes - 1
        return int(value.decode() if isinstance(value, (bytes, bytearray)) else value)

    def __call__(self, source: Iterable[dict]) -> Iterator[dict]:
        self._passes += 1
        if self.kind == "paired" and not self.shuffle:
            for item in source:
                block = [_Item(item)]
                yield from self._paired(block, None)
            return
        for block in self._blocks(source):
            block.sort(key=lambda item: item.order)
            draws = _Draws(self.seed, self._epoch_of(block[0]))
            rnd = draws.block(block[0].order)
            if self.kind == "paired":
                yield from self._paired(block, rnd, draws)
            elif self.kind == "unpaired":
                yield from self._unpaired(block, rnd, draws)
            else:
                yield from self._grouped(block, rnd, draws)

    # -- volumes
    def _image(self, item: _Item, field: str, volume_meta: dict, shape, position: int | None = None) -> np.ndarray:
        array = item.get(field) if position is None else item.grouped(field, position)
        if array is None:
            raise ConfigError(f"sample {item.key!r} has no {field!r} member")
        return resize(normalize(to_float32(array, volume_meta)), shape)

    def _label(self, item: _Item, field: str, volume_meta: dict,
               position: int | None = None) -> tuple[np.ndarray, dict] | None:
        """The stored label and its metadata (converted to float32 only after a channel is picked)."""
        if not self.labeled:
            return None
        array = item.get(field) if position is None else item.grouped(field, position)
        if array is None:
            raise ConfigError(f"sample {item.key!r} has no {field!r}: the split was converted without labels; "
                              f"pass labeled=False")
        return stored_label(array), volume_meta

    def _emit(self, moving_image, fixed_image, moving_label, fixed_label, image_indices: tuple,
              draws: "_Draws") -> Iterator[dict]:
        name = "pair_" + "_".join(str(int(i)) for i in image_indices)
        if moving_label is None:
            yield {"__key__": name, "moving_image": moving_image, "fixed_image": fixed_image,
                   "indices": np.asarray([*image_indices, -1], dtype=np.float32)}
            return
        (moving_label, moving_meta), (fixed_label, fixed_meta) = moving_label, fixed_label
        moving_count = 1 if moving_label.ndim == 3 else moving_label.shape[3]
        fixed_count = 1 if fixed_label.ndim == 3 else fixed_label.shape[3]
        if moving_count != fixed_count:
            raise DeepRegSamplingError(
                f"Sample {list(image_indices)}'s moving image and fixed image have different numbers of labels. "
                f"moving: {moving_count}, fixed: {fixed_count}")
        if moving_label.ndim == 3:
            label_indices = [0]
        elif self.sample_label == "all":
            label_indices = list(range(moving_count))
        else:
            label_indices = [draws.label(tuple(image_indices)).randrange(moving_count)]
        for k in label_indices:
            moving = moving_label if moving_label.ndim == 3 else moving_label[..., k]
            fixed = fixed_label if fixed_label.ndim == 3 else fixed_label[..., k]
            yield {
                "__key__": f"{name}/label_{k}",
                "moving_image": moving_image,
                "fixed_image": fixed_image,
                "moving_label": resize(np.ascontiguousarray(to_float32(moving, moving_meta)), self.moving_shape),
                "fixed_label": resize(np.ascontiguousarray(to_float32(fixed, fixed_meta)), self.fixed_shape),
                "indices": np.asarray([*image_indices, k], dtype=np.float32),
            }

    # -- the three kinds
    def _paired(self, block: list[_Item], rnd: random.Random | None, draws: _Draws | None = None):
        order = paired_order(len(block), rnd) if rnd is not None else range(len(block))
        for position in order:
            item = block[position]
            if draws is None:
                draws = _Draws(self.seed, self._epoch_of(item))
            volumes = item.meta["volumes"]
            yield from self._emit(
                self._image(item, "moving_image", volumes.get("moving_image"), self.moving_shape),
                self._image(item, "fixed_image", volumes.get("fixed_image"), self.fixed_shape),
                self._label(item, "moving_label", volumes.get("moving_label")),
                self._label(item, "fixed_label", volumes.get("fixed_label")),
                (item.meta["index"],),
                draws,
            )

    def _unpaired(self, block: list[_Item], rnd: random.Random, draws: _Draws):
        for first, second in unpaired_order(len(block), rnd):
            moving, fixed = block[first], block[second]
            yield from self._emit(
                self._image(moving, "image", moving.meta["volumes"].get("image"), self.moving_shape),
                self._image(fixed, "image", fixed.meta["volumes"].get("image"), self.fixed_shape),
                self._label(moving, "label", moving.meta["volumes"].get("label")),
                self._label(fixed, "label", fixed.meta["volumes"].get("label")),
                (moving.meta["index"], fixed.meta["index"]),
                draws,
            )

    def _grouped(self, block: list[_Item], rnd: random.Random, draws: _Draws):
        check_grouped_options(block[0].meta.get("num_groups", len(block)), self.intra_group_prob,
                              self.intra_group_option, self.sample_image_in_group)
        if self.intra_group_prob < 1 and len(block) < 2:
            raise ConfigError(
                f"sample {block[0].key!r}: inter-group pairs are drawn among the groups of one shard, but this "
                f"stream holds only one group of it (a shard split between DataLoader workers, or block_size=1); "
                f"use fewer workers or a larger block_size")
        sizes = [len(item.meta["names"]) for item in block]
        if self.sample_image_in_group:
            indices = grouped_sampled(sizes, rnd, self.intra_group_prob, self.intra_group_option)
        else:
            indices = grouped_iterated(sizes, rnd, self.intra_group_prob, self.intra_group_option)
        images: dict[tuple, np.ndarray] = {}  # decoded once per block

        def image(group: int, position: int, shape) -> np.ndarray:
            cache_key = (group, position, None if shape is None else tuple(shape))
            if cache_key not in images:
                item = block[group]
                images[cache_key] = self._image(item, "image", item.meta["volumes"][position].get("image"), shape,
                                                position)
            return images[cache_key]

        def label(group: int, position: int):
            item = block[group]
            return self._label(item, "label", item.meta["volumes"][position].get("label"), position)

        for first_group, first, second_group, second in indices:
            yield from self._emit(
                image(first_group, first, self.moving_shape),
                image(second_group, second, self.fixed_shape),
                label(first_group, first),
                label(second_group, second),
                (block[first_group].meta["group_index"], first, block[second_group].meta["group_index"], second),
                draws,
            )


def _shape(value, name: str, message: str):
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{message}, got {name}={value!r}") from None
    if len(shape) != 3 or min(shape) <= 0:
        raise ConfigError(f"{message}, got {name}={value!r}")
    return shape


def pairs(
    kind: str,
    *,
    moving_image_shape=None,
    fixed_image_shape=None,
    image_shape=None,
    labeled: bool = True,
    sample_label: str = "sample",
    intra_group_prob: float = 1.0,
    intra_group_option: str = "forward",
    sample_image_in_group: bool = True,
    seed: int | None = None,
    epoch: int | Callable[[], int] | None = None,
    block_size: int | None = None,
    shuffle: bool = True,
) -> Callable[[Iterable[dict]], Iterator[dict]]:
    """A stage `.compose(pairs("paired", moving_image_shape=..., ...))`: DeepReg's sample dicts.

    `seed=None` (DeepReg's train default) draws anew each epoch, from `epoch` (an int, a callable
    returning it, or each sample's `__epoch__`); an integer seed (DeepReg's valid/test default is
    0) gives the same pairs every epoch. Label sampling is drawn per pair from the same source (in
    DeepReg it used the unseeded global `random`). `block_size` caps how many samples of a shard are
    paired together (default: the whole shard); `shuffle=False` streams paired data without
    buffering, in arrival order.
    """
    if kind not in KINDS:
        raise ConfigError(f"pairs(kind) must be one of {list(KINDS)}, got {kind!r}")
    if sample_label not in ("sample", "all"):
        raise ConfigError(f"Unknown label sampling policy {sample_label!r}, must be 'sample' or 'all'")
    if seed is not None and not isinstance(seed, int):
        raise ConfigError(f"seed must be an int or None, got {seed!r}")
    if block_size is not None and block_size < 1:
        raise ConfigError(f"block_size must be positive, got {block_size}")
    if kind == "paired":
        message = "moving_image_shape and fixed_image_shape have length of three, corresponding to (width, height, depth)"
        moving = _shape(moving_image_shape, "moving_image_shape", message)
        fixed = _shape(fixed_image_shape, "fixed_image_shape", message)
    else:
        if moving_image_shape is not None or fixed_image_shape is not None:
            raise ConfigError(f"{kind} data use image_shape, not moving_image_shape/fixed_image_shape")
        moving = fixed = _shape(image_shape, "image_shape",
                                "image_shape has to be length of three, corresponding to (width, height, depth)")
    if kind == "grouped":
        check_grouped_options(None, float(intra_group_prob), intra_group_option, bool(sample_image_in_group))
    return _Pairs(kind, moving, fixed, bool(labeled), sample_label, float(intra_group_prob), intra_group_option,
                  bool(sample_image_in_group), seed, epoch, block_size, shuffle)


def collate(samples: list[dict]) -> dict:
    """Stack DeepReg sample dicts into `(batch,) + shape` float32 tensors (`__key__` -> list)."""
    import torch

    if not samples:
        raise ValueError("collate needs at least one sample")
    batch: dict = {}
    for name in samples[0]:
        values = [sample[name] for sample in samples]
        if isinstance(values[0], np.ndarray):
            batch[name] = torch.from_numpy(np.stack(values))
        elif isinstance(values[0], torch.Tensor):
            batch[name] = torch.stack(values)
        else:
            batch[name] = values
    return batch
