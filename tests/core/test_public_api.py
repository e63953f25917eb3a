"""The public API a new user touches: names that stay what `__all__` documents whatever is imported
first, and `wdsprep.Loader` passing bytes fields through untouched."""
import json
import subprocess
import sys
import textwrap

import numpy as np

import wdsprep
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter

# What each public name of `wdsprep` is documented to be (README and the package docstring).
EXPECTED_KINDS = {
    "urls": "function",
    "dataset": "function",
    "mix": "function",
    "Part": "class",
    "decode": "function",
    "decode_sample": "function",
    "zst_handler": "function",
    "unpack": "function",
    "unpack_rows": "function",
    "Loader": "class",
    "MapDataset": "class",
    "index": "function",
    "WdsprepError": "exception",
    "InputError": "exception",
    "OutputError": "exception",
    "ConversionError": "exception",
    "UnitFailedError": "exception",
    "FormatError": "exception",
    "ShardError": "exception",
    "ManifestError": "exception",
    "ConfigError": "exception",
    "UploadError": "exception",
    "FetchError": "exception",
    "DownloadError": "exception",
    "DeepRegSamplingError": "exception",
    "voxels": "module wdsprep.sources.voxels",
    "minecraft": "module wdsprep.sources.minecraft",
    "deepreg": "module wdsprep.sources.deepreg",
    "rawnind": "module wdsprep.sources.rawnind",
    "noisebase": "module wdsprep.sources.noisebase",
}

# Runs in one fresh interpreter: for each order, forget every wdsprep module (and its import hooks),
# import wdsprep anew, touch the names (or import the submodules) in that order, then record what
# every public name is and what `from wdsprep import *` binds.
_PROBE = textwrap.dedent(
    """
    import importlib, inspect, json, sys, types

    def kind(value):
        if isinstance(value, types.ModuleType):
            return "module " + value.__name__
        if inspect.isclass(value):
            return "exception" if issubclass(value, BaseException) else "class"
        if inspect.isfunction(value):
            return "function"
        return type(value).__name__

    results = []
    for order in json.loads(sys.argv[1]):
        for name in [m for m in sys.modules if m == "wdsprep" or m.startswith("wdsprep.")]:
            del sys.modules[name]
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("wdsprep")]
        wdsprep = importlib.import_module("wdsprep")
        for name in order:
            if name.startswith("wdsprep."):
                importlib.import_module(name)
            else:
                getattr(wdsprep, name)
        star = {}
        exec("from wdsprep import *", star)
        stream = importlib.import_module("wdsprep.stream")
        results.append({
            "order": order,
            "all": sorted(wdsprep.__all__),
            "attr": {name: kind(getattr(wdsprep, name)) for name in wdsprep.__all__},
            "star": {name: kind(star[name]) for name in wdsprep.__all__ if name in star},
            "stream": {name: kind(getattr(stream, name)) for name in stream.__all__},
        })
    print(json.dumps(results))
    """
)

SUBMODULES = [
    "wdsprep.stream",
    "wdsprep.stream.loader",
    "wdsprep.stream.dataset",
    "wdsprep.stream.manifests",
    "wdsprep.stream.planning.plan",
    "wdsprep.shards.codec",
    "wdsprep.sources.generic",
    "wdsprep.cli",
    "wdsprep.conversion",
]


def _probe(orders: list[list[str]]) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(orders)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _orders() -> list[list[str]]:
    names = sorted(EXPECTED_KINDS)
    orders = [[name] for name in names]  # each public name touched first
    orders += [[module] for module in SUBMODULES]  # each submodule imported first
    orders += [names, names[::-1], SUBMODULES + names, names + SUBMODULES]
    return orders


def test_all_lists_exactly_the_documented_names():
    assert sorted(wdsprep.__all__) == sorted(EXPECTED_KINDS)


def test_public_names_are_never_shadowed_whatever_is_imported_first():
    orders = _orders()
    results = _probe(orders)
    assert [seen["order"] for seen in results] == orders
    for seen in results:
        order = seen["order"]
        assert seen["all"] == sorted(EXPECTED_KINDS), order
        assert seen["attr"] == EXPECTED_KINDS, f"after touching {order} first"
        assert seen["star"] == EXPECTED_KINDS, f"from wdsprep import * after touching {order} first"
        assert not [n for n, k in seen["stream"].items() if k.startswith("module")], f"wdsprep.stream after {order}"


def test_the_issue_reproduction_loader_over_dataset(tmp_path):
    """`wdsprep.Loader(wdsprep.dataset(...))` after touching `wdsprep.Loader` first."""
    manifest = _bytes_manifest(tmp_path, payloads=[b"x"])
    code = f"import wdsprep; wdsprep.Loader; loader = wdsprep.Loader(wdsprep.dataset({manifest!r}, 'train')); print(sum(1 for _ in loader))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def _bytes_manifest(directory, payloads: list[bytes]) -> str:
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 40, encoder=Encoder("none"))  # raw .npy members
    with writer:
        for i, payload in enumerate(payloads):
            writer.write(f"s{i:03d}", {"value": np.frombuffer(payload, dtype=np.uint8) + 0, "meta": {"i": i}})
    rows = [dict(row.as_dict(), unit=0) for row in writer.rows]
    (directory / "manifest.json").write_bytes(Manifest("test", {}, "fp", {"train": rows}).dumps())
    return str(directory / "manifest.json")


def _members_by_tarfile(manifest: str) -> dict[str, bytes]:
    """Every member of the split's shards, read by Python's tarfile (an independent reader)."""
    import tarfile

    members = {}
    for url in wdsprep.urls(manifest, "train"):
        with tarfile.open(url) as tar:
            for info in tar.getmembers():
                if not info.name.startswith("__"):
                    members[info.name] = tar.extractfile(info).read()
    return members


def test_loader_without_batching_leaves_bytes_fields_alone(tmp_path):
    """Raw samples carry member data as bytes-like values; the Loader must hand them over as they
    are (torch's default conversion would turn every byte of a bytearray into a tensor element)."""
    payloads = [bytes(range(256)) * 4096, b"", b"\x00\xff" * 1000]  # 1 MiB: ~1 s per sample before the fix
    manifest = _bytes_manifest(tmp_path, payloads)
    got = {}
    for sample in wdsprep.Loader(wdsprep.dataset(manifest, "train", shuffle_shards=False), batch_size=None):
        assert isinstance(sample["__key__"], str)
        for field in ("value.npy", "meta.mp"):
            assert isinstance(sample[field], (bytes, bytearray, memoryview)), (field, type(sample[field]))
            got[f"{sample['__key__']}.{field}"] = bytes(sample[field])
    assert len(got) == 2 * len(payloads)
    assert got == _members_by_tarfile(manifest)


class _CountingBytes(bytearray):
    """A bytes field that counts per-element visits (torch's default conversion walks a bytearray
    element by element, ~1 s per MB)."""

    visits = 0

    def __iter__(self):
        type(self).visits += 1
        return super().__iter__()

    def __getitem__(self, index):
        type(self).visits += 1
        return super().__getitem__(index)


def test_loader_does_no_per_element_work_on_bytes_fields(tmp_path):
    manifest = _bytes_manifest(tmp_path, [bytes(range(256)) * 64, b"xy"])

    def wrap(source):
        for sample in source:
            yield {k: _CountingBytes(v) if k.endswith(".npy") else v for k, v in sample.items()}

    _CountingBytes.visits = 0
    samples = list(wdsprep.Loader(wdsprep.dataset(manifest, "train", shuffle_shards=False).compose(wrap)))
    assert len(samples) == 2
    assert _CountingBytes.visits == 0
    assert all(isinstance(sample["value.npy"], bytearray) for sample in samples)


def test_loader_batches_keep_bytes_fields_as_lists_of_bytes(tmp_path):
    manifest = _bytes_manifest(tmp_path, [b"a", b"b", b"c"])
    batches = list(wdsprep.Loader(wdsprep.dataset(manifest, "train", shuffle_shards=False), batch_size=2))
    assert [len(batch["__key__"]) for batch in batches] == [2, 1]
    for batch in batches:
        assert all(isinstance(v, (bytes, bytearray, memoryview)) for v in batch["value.npy"])
    members = _members_by_tarfile(manifest)
    assert [bytes(v) for batch in batches for v in batch["value.npy"]] == [members[f"s{i:03d}.value.npy"] for i in range(3)]


def test_loader_still_converts_arrays_to_tensors(tmp_path):
    import torch

    manifest = _bytes_manifest(tmp_path, [b"a", b"b"])
    samples = list(wdsprep.Loader(wdsprep.dataset(manifest, "train", shuffle_shards=False).compose(wdsprep.decode(strip=True))))
    assert len(samples) == 2
    for i, sample in enumerate(sorted(samples, key=lambda s: s["__key__"])):
        assert isinstance(sample["value"], torch.Tensor)
        assert sample["value"].tolist() == [ord("ab"[i])]
