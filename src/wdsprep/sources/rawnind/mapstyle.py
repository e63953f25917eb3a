"""A map-style drop-in for the legacy `rawds.CleanProfiledRGBNoisyBayerImageCropsDataset`
(and, with `input="rgb"`, `CleanProfiledRGBNoisyProfiledRGBImageCropsDataset`).

Like the legacy class, an item is a *pair* (reference clean capture, y capture: upstream's pairs,
clean-clean and second-reference ones included; filtered by alignment loss, mask mean, MS-SSIM)
and `__getitem__(i)` returns `num_crops` random crops from a random pre-cropped tile of that pair.
It reads shards at any location by byte offset (each shard's sample index) through
`wdsprep.MapDataset`, so any DataLoader sampler works; every read is checked against that index, so
a corrupted shard is a `ShardError` naming it, never a crop.
Randomness is drawn from (seed, epoch, i) instead of the global `random` module, so an item is
reproducible; call `set_epoch` to get new crops each epoch.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np

from ...errors import ConfigError
from ...shards.codec import decode_sample, split_field
from ...stream.mapdataset import MapDataset
from .read import _check_crop_size, crop_pair, pair_files, pair_passes

_FIELDS = ("clean", "noisy", "gt_rgb", "noisy_bayer", "mask", "meta")  # both layouts (see convert)

try:  # a torch Dataset when torch is there (it always is with wdsprep), a plain class otherwise
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover
    _Base = object


class CleanProfiledRGBNoisyBayerImageCropsDataset(_Base):
    """`len()` = pairs that pass the filters; `ds[i]` = x_crops, y_crops, mask_crops, rgb_xyz_matrix, gain."""

    def __init__(
        self,
        manifest_url: str,
        split: str | None = None,
        *,
        num_crops: int = 4,
        crop_size: int = 256,
        alignment_max_loss: float | None = 0.035,
        mask_mean_min: float | None = 0.8,
        match_gain: bool = False,
        min_valid: float = 0.5,
        test: bool = False,
        seed: int = 0,
        to_torch: bool = True,
        legacy_values: bool = False,
        input: str = "bayer",
        min_msssim_score: float | None = 0.0,
        max_msssim_score: float | None = 1.0,
        clean_clean: bool = True,
        second_references: bool = True,
    ):
        _check_crop_size(crop_size)
        self.split = split or ("test" if test else "train")
        self.options = dict(crop_size=crop_size, num_crops=num_crops, min_valid=min_valid,
                            match_gain=match_gain, to_torch=to_torch, legacy_values=legacy_values, input=input)
        self.seed = seed
        self.epoch = 0
        self.data = MapDataset(manifest_url, self.split, decode=False)  # raw: only some members are read
        tiles_of_pair: dict[tuple[str, str, str], list[tuple[int, str, int]]] = defaultdict(list)
        self._positions: dict[tuple[int, str], int] = {}  # (shard, key) -> the sample's position
        for positions, raws in self.data.by_shard(("meta.mp",)):  # one shard's metas at a time
            for position, raw in zip(positions, raws):
                key, (shard_index, _) = raw["__key__"], self.data.locate(position)
                self._positions[(shard_index, key)] = position
                meta = decode_sample(raw)["meta"]
                if input == "bayer" and not meta.get("is_bayer", True):
                    continue  # X-Trans scenes have no RGGB input
                for n in range(len(meta["best_alignment_loss"])):
                    if pair_passes(meta, n, alignment_max_loss, mask_mean_min, min_msssim_score, max_msssim_score,
                                   clean_clean, second_references):
                        tiles_of_pair[(meta["scene"], *pair_files(meta, n))].append((shard_index, key, n))
        self.pairs = sorted(tiles_of_pair)
        self._tiles = [sorted(tiles_of_pair[pair]) for pair in self.pairs]
        if not self.pairs:
            raise ConfigError(f"{manifest_url}: no pair in split {self.split!r} passes the filters "
                              f"(alignment loss <= {alignment_max_loss}, mask mean >= {mask_mean_min})")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.pairs)

    def _tile(self, shard_index: int, key: str) -> dict:
        position = self._positions[(shard_index, key)]
        names = [name for name in self.data.member_names(position) if split_field(name)[0] in _FIELDS]
        return decode_sample(self.data.read([position], names)[0])

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} out of range ({len(self)} pairs)")
        i %= len(self)
        # a pair whose tiles all fail the valid-pixel rule gives way to the next one, as the
        # legacy loader drops the pre-crop and retries
        for step in range(len(self)):
            index = (i + step) % len(self)
            digest = hashlib.sha256(f"{self.seed}:{self.epoch}:{index}".encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:16], "little"))
            tiles = self._tiles[index]
            for tile_number in rng.permutation(len(tiles)):
                shard_index, key, n = tiles[int(tile_number)]
                out = crop_pair(self._tile(shard_index, key), n, rng, **self.options)
                if out is not None:
                    return out
        raise ConfigError(f"no pair of split {self.split!r} has crops with {self.options['min_valid']} valid pixels")
