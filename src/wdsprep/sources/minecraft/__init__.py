"""MineDojo-style Minecraft episodes: native per-frame pickles -> episode shards -> frame pairs.

Reader API (`wdsprep.minecraft.<name>`):

    urls = wdsprep.urls("shards/minecraft/manifest.json", "train")
    pipeline = wds.WebDataset(urls).compose(wdsprep.minecraft.pairs(task="frame_prediction"))
    vocab = wdsprep.minecraft.vocabulary("shards/minecraft/manifest.json")
    print(wdsprep.minecraft.voxel_to_text(next(iter(pipeline))["voxel"], vocab))

The readers (torch) load on first use; the converter does not need them.
"""
from __future__ import annotations

from .. import lazy_exports
from .convert import SOURCE, MinecraftSource, episode_key
from .native import ACTION_FIELDS, ACTION_NAMES

__all__ = [
    "SOURCE",
    "MinecraftSource",
    "pairs",
    "pair_counts",
    "MinecraftPairs",
    "vocabulary",
    "Vocabulary",
    "voxel_to_text",
    "action_to_text",
    "collate",
    "collate_fn",
    "episode_key",
    "TASKS",
    "ACTION_FIELDS",
    "ACTION_NAMES",
]

__getattr__ = lazy_exports(__name__, dict.fromkeys(
    ["TASKS", "MinecraftPairs", "Vocabulary", "action_to_text", "collate", "collate_fn", "pair_counts", "pairs",
     "vocabulary", "voxel_to_text"], ".read"))
