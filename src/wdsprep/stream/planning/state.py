"""Resume state: where a worker is (`Position`), how far the epochs have come (`EpochProgress`, not
to be confused with the progress line of `wdsprep.progress`), and the one codec of the state dict
(`encode_state` / `parse_state`) with its checks. `ShardDataset` and `wdsprep.Loader` both save and
load through this module and nothing else.

Resume contract. Each worker counts how many source samples it pulled and how many outputs the
stages produced of the current one (stream/worker.py); a state holds, per worker, `skip` (source
samples fully passed), `discard` (outputs of the next one already delivered) and `delivered`
(outputs delivered in the pass, padding included). A resumed worker skips the pulled samples
cheaply and discards the outputs already delivered.

A live position is an object (`Position`; a mix's `MixPosition`, one per part); whatever is saved
or sent between processes is its `as_dict()` (a state, a Loader worker's message, beside the batch
and never a field of a sample, so a user's collate cannot lose it), made back into an object by the
dataset's `position(saved)` where a pass starts. A state is a dict: the layout it was read with (`dataset` = digest of the split's shard rows,
`split`, `seed`, `shuffle_shards`, `shuffle_buffer`, `equalize`, `rank`, `world_size`), what it was
read from (`provenance()`: a dataset's pinned manifest `location`, never compared), `epoch`,
`num_workers`, `workers` (worker -> position) and `resumed_from` (the interrupted passes this one
continues), plus what the saver adds (the Loader's `next_worker`). A state from another dataset,
split, seed, shuffle or equalize is refused with the name that differs.

Elastic resume. `parse_state` takes this rank's own state (same world size, rank and workers), or
the list of every rank's state: the interrupted pass becomes a `Level` of the epoch's history, and
the next pass deals what the history left (`plan.remainder`); no worker position is then resumed.
The history is saved in `resumed_from`, so a resumed pass can itself be resumed elastically; a
state holds positions only, never sample lists.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ...errors import ConfigError
from .plan import Level


@dataclass
class Position:
    """Where a worker's stream is: source samples fully passed, outputs of the current one delivered."""

    skip: int = 0
    discard: int = 0
    delivered: int = 0

    def as_dict(self) -> dict:
        return {"skip": self.skip, "discard": self.discard, "delivered": self.delivered}


class PhaseLevel(NamedTuple):
    """What an elastic resume keeps of a worker's position in a mix of several phases (stream/mix.py
    rule M8): its phase, and (skip, discard) per part in that phase."""

    phase: int
    parts: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class EpochProgress:
    """How far the epochs have come: the epoch, whether it advances after each full pass, and the
    interrupted passes of this epoch that the next pass continues. Immutable: each change makes a
    new one, so copies of a pipeline never share a change."""

    epoch: int = 0
    auto_epoch: bool = True
    levels: tuple[Level, ...] = ()

    def at_epoch(self, epoch: int) -> EpochProgress:
        """`set_epoch`: that epoch from its start, fixed from now on."""
        return EpochProgress(int(epoch), False, ())

    def pass_done(self) -> EpochProgress:
        """After a full pass: the next pass deals a whole epoch, the next one when epochs advance."""
        return EpochProgress(self.epoch + 1 if self.auto_epoch else self.epoch, self.auto_epoch, ())

    def resumed(self, state: Resume) -> EpochProgress:
        return EpochProgress(state.epoch, self.auto_epoch, state.levels)


class Epochs:
    """The epoch of whatever holds an `EpochProgress` as `progress` (the dataset, a mix, the Loader):
    `epoch`, `auto_epoch`, and `set_epoch`, which fixes an epoch from its start."""

    progress: EpochProgress

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    @property
    def auto_epoch(self) -> bool:
        return self.progress.auto_epoch

    def set_epoch(self, epoch: int) -> None:
        self.progress = self.progress.at_epoch(epoch)


@dataclass(frozen=True)
class Resume:
    """What a loaded state says: the epoch, its interrupted passes, each worker's position (as dicts)."""

    epoch: int
    levels: tuple[Level, ...]
    positions: dict[int, dict]


def encode_state(layout: dict, progress: EpochProgress, num_workers: int, positions: dict[int, dict], **extra) -> dict:
    """A rank's state: its layout, the epoch, each worker's position and the passes it resumes."""
    return {**layout, "epoch": progress.epoch, "num_workers": num_workers, **extra,
            "workers": {str(w): dict(p) for w, p in sorted(positions.items())},
            "resumed_from": [_level_json(level) for level in progress.levels]}


def worker_level(position: dict) -> tuple[int, int]:
    """What an interrupted pass's `Level` keeps of a worker's saved position: (skip, discard)."""
    return int(position["skip"]), int(position.get("discard", 0))


def parse_state(state: dict | list, layout: dict, num_workers: int, what: str = "dataset",
                level_value: Callable[[dict], Any] = worker_level) -> Resume:
    """Check a state (this rank's own, or every old rank's) against this reader's layout and worker
    count; the epoch, passes and worker positions to resume from (no positions after an elastic
    resume). `level_value`: what an elastic resume keeps of each worker's position (a mix keeps one
    (skip, discard) per part)."""
    states = state if isinstance(state, list) else [state]
    if not states or not all(isinstance(s, dict) for s in states):
        raise ConfigError("a state is a dict (this rank's) or a list of every rank's dicts")
    for one in states:
        if "mix" in one and "mix" not in layout:
            raise ConfigError(f"state was saved from a mix (wdsprep.mix), this {what} reads one split")
        for name in ("split", "seed", "dataset", "selection", "shuffle_shards", "shuffle_buffer", "equalize"):
            if one.get(name) != layout.get(name):
                raise ConfigError(f"state was saved with {name}={one.get(name)!r}, this {what} has {layout[name]!r}")
    first = states[0]
    levels = tuple(_level_from_json(level) for level in first.get("resumed_from", []))
    if not isinstance(state, list):
        for name, here in (("world_size", layout["world_size"]), ("rank", layout["rank"]), ("num_workers", num_workers)):
            if first.get(name) != here:
                raise ConfigError(
                    f"state was saved with {name}={first.get(name)!r}, this {what} has {here!r}; "
                    "to resume on another world, pass the list of every rank's state"
                )
        return Resume(int(first["epoch"]), levels, {int(w): dict(p) for w, p in first["workers"].items()})
    world = len(states)
    for name in ("epoch", "world_size", "num_workers", "resumed_from"):
        values = {json.dumps(s.get(name), sort_keys=True) for s in states}
        if len(values) != 1:
            raise ConfigError(f"the states disagree on {name} ({', '.join(sorted(values))})")
    if first.get("world_size") != world or sorted(s.get("rank") for s in states) != list(range(world)):
        raise ConfigError(f"the list must hold one state per rank 0..{first.get('world_size')}-1 "
                          f"(got ranks {[s.get('rank') for s in states]})")
    positions = {(s["rank"], int(w)): level_value(p) for s in states for w, p in s["workers"].items()}
    return Resume(int(first["epoch"]), (*levels, Level(world, int(first["num_workers"]), positions)), {})


def _level_json(level: Level) -> dict:
    """A pass's positions as [rank, worker, skip, discard] (a mix's: [rank, worker, [[skip, discard], ...]];
    a mix's of several phases: [rank, worker, [[skip, discard], ...], phase])."""
    positions = []
    for (r, w), value in sorted(level.positions.items()):
        if isinstance(value, PhaseLevel):
            positions.append([r, w, [list(pair) for pair in value.parts], value.phase])
        elif isinstance(value[0], int):
            positions.append([r, w, *value])
        else:
            positions.append([r, w, [list(pair) for pair in value]])
    return {"world_size": level.world_size, "num_workers": level.num_workers, "positions": positions}


def _level_from_json(data: dict) -> Level:
    positions: dict = {}
    for entry in data["positions"]:
        r, w, *value = entry
        if isinstance(value[0], list):
            parts = tuple((int(skip), int(discard)) for skip, discard in value[0])
            positions[int(r), int(w)] = parts if len(value) == 1 else PhaseLevel(int(value[1]), parts)
        else:
            positions[int(r), int(w)] = (int(value[0]), int(value[1]))
    return Level(int(data["world_size"]), int(data["num_workers"]), positions)
