"""A generic input whose samples carry known small fields, converted with index fields through
`wdsprep pipeline` (the command line; the spec's `[convert]` table names `index_fields`), and the
facts a selection test checks against, read back here with `tarfile` alone.

Each sample of split `train` (53 samples, keys `k000`..`k052`) and `valid` (11) is an array of a
random length (so shards hold uneven counts) and `meta.json` with `label` (0-4), `score` (a float),
`tag` (a string, non-ASCII included), `flag` (a bool) and, on every third sample only, `rare` (an int).
The values are the test's own (`values[split][key]`), never read from the table under test.
"""
from __future__ import annotations

import json
import pathlib
import tarfile

import numpy as np

from wdsprep.conformance import read_manifest, run_cli, tar_samples

SPLITS = {"train": 53, "valid": 11}
FIELDS = ("meta.label", "meta.score", "meta.tag", "meta.flag", "meta.rare")
TAGS = ("cat", "dog", "ému", "owl")
MISSING = {"rare": -1}  # an integer field a sample lacks holds -1 in the table (docs/format.md)


def labelled_values(seed: int = 0) -> dict[str, dict[str, dict]]:
    """split -> key -> the sample's meta dict."""
    rng = np.random.default_rng(seed)
    values: dict[str, dict[str, dict]] = {}
    for split, count in SPLITS.items():
        values[split] = {}
        for i in range(count):
            meta = {"label": int(rng.integers(5)), "score": round(float(rng.random()), 3),
                    "tag": TAGS[int(rng.integers(len(TAGS)))], "flag": bool(rng.integers(2))}
            if i % 3 == 0:
                meta["rare"] = int(rng.integers(0, 100))
            values[split][f"k{i:03d}"] = meta
    return values


def write_labelled_input(directory: pathlib.Path, seed: int = 0) -> dict[str, dict[str, dict]]:
    """The generic input (`<split>/<key>.array.npy`, `<split>/<key>.meta.json`); returns its values."""
    values = labelled_values(seed)
    rng = np.random.default_rng(seed + 1)
    for split, samples in values.items():
        (directory / split).mkdir(parents=True, exist_ok=True)
        for key, meta in samples.items():
            np.save(directory / split / f"{key}.array.npy", rng.standard_normal(int(rng.integers(8, 600))).astype(np.float32))
            (directory / split / f"{key}.meta.json").write_text(json.dumps(meta))
    return values


def convert_with_fields(native: pathlib.Path, output: pathlib.Path, fields=FIELDS, **convert) -> tuple[int, str, str]:
    """`wdsprep pipeline SPEC --quiet` converting `native` into `output` with `index_fields=fields`
    (None: the source's defaults) and `convert` (shard_bytes, workers, ...): (status, stdout, stderr)."""
    table = {"shard_bytes": "16KB", **convert}
    if fields is not None:
        table["index_fields"] = list(fields)
    lines = [f"source = {json.dumps('generic')}", f"input = {json.dumps(str(native))}",
             f"output = {json.dumps(str(output))}", "[convert]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in table.items()]
    spec = output.parent / f"{output.name}.toml"
    spec.write_text("\n".join(lines) + "\n")
    return run_cli("pipeline", spec, "--quiet")


def shard_keys(output: pathlib.Path, split: str) -> list[list[str]]:
    """The keys of each shard of `split`, in manifest order, read with tarfile."""
    rows = read_manifest(output)["splits"][split]["shards"]
    return [[key for key, _ in tar_samples(output / row["name"])] for row in rows]


def field_of(meta: dict, name: str):
    """A sample's value of index field `meta.<name>` as a selection sees it (absent: the missing value)."""
    return meta.get(name, MISSING.get(name))


def member_bytes(output: pathlib.Path, name: str, member: str) -> bytes:
    with tarfile.open(output / name) as archive:
        return archive.extractfile(member).read()
