"""A new URL scheme is one module: `toy://`, an in-memory object store defined in this file only.

The scheme below is entered in `wdsprep.storage.SCHEMES` and nothing else changes: `wdsprep convert`
writes shards and manifest through it, `wdsprep upload` copies a local conversion into it,
`wdsprep verify` checks it, and `wdsprep.dataset(...)` streams it back. It declares no capability
(no lock, no append, no listing), so the core runs on the `Store` defaults. What comes back is
compared with the native input files (numpy and json, not wdsprep) and the stored bytes with a plain
local conversion of the same input.
"""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

import wdsprep
from wdsprep import cli, storage
from wdsprep.sources.generic import SOURCE as GENERIC

# ---------------------------------------------------------------------------------- the toy scheme


class ToyStore(storage.Store):
    """`toy://PREFIX`: objects `toy://PREFIX/NAME` in a dict shared with the scheme."""

    def __init__(self, url: str, objects: dict[str, bytes]):
        super().__init__(url.rstrip("/"))
        self.objects = objects

    def publish(self, local_path: str, name: str) -> None:
        with open(local_path, "rb") as handle:
            self.objects[self.name_url(name)] = handle.read()
        os.unlink(local_path)

    def stat(self, name: str) -> int | None:
        data = self.objects.get(self.name_url(name))
        return None if data is None else len(data)

    def read_bytes(self, name: str) -> bytes | None:
        return self.objects.get(self.name_url(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        self.objects[self.name_url(name)] = bytes(data)

    def delete(self, name: str) -> None:
        self.objects.pop(self.name_url(name), None)


class ToyScheme(storage.Scheme):
    writable = True
    example = "toy://PREFIX"

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def open(self, url: str):
        if url not in self.objects:
            raise wdsprep.ShardError(url, "no such toy object")
        return io.BytesIO(self.objects[url])

    def store(self, url: str, **options) -> ToyStore:
        return ToyStore(url, self.objects)


# ---------------------------------------------------------------------------------------- the test


@pytest.fixture
def toy(monkeypatch) -> ToyScheme:
    scheme = ToyScheme()
    monkeypatch.setitem(storage.SCHEMES, "toy", scheme)
    return scheme


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("toy") / "native"
    GENERIC.synth(str(root), seed=5, splits={"train": 17, "valid": 4})
    return str(root)


def _native_samples(root: str, split: str) -> dict[str, tuple[np.ndarray, dict]]:
    """The input as numpy and json read it: key -> (array, meta)."""
    directory = os.path.join(root, split)
    keys = sorted({name.partition(".")[0] for name in os.listdir(directory)})
    samples = {}
    for key in keys:
        with open(os.path.join(directory, f"{key}.meta.json")) as handle:
            samples[key] = (np.load(os.path.join(directory, f"{key}.array.npy")), json.load(handle))
    return samples


def _streamed(url: str, split: str) -> dict[str, tuple[np.ndarray, dict]]:
    pipeline = wdsprep.dataset(url, split, shuffle_shards=False, equalize=None, rank=0, world_size=1)
    samples = [wdsprep.decode_sample(raw) for raw in pipeline]
    streamed = {sample["__key__"]: (sample["array"], sample["meta"]) for sample in samples}
    assert len(streamed) == len(samples), "a key came back twice"
    return streamed


def _assert_same(streamed: dict, native: dict) -> None:
    assert sorted(streamed) == sorted(native)
    for key, (array, meta) in native.items():
        np.testing.assert_array_equal(streamed[key][0], array)
        assert streamed[key][0].dtype == array.dtype
        assert streamed[key][1] == meta


def test_convert_upload_verify_and_stream_through_a_scheme_defined_in_a_test(toy, native, tmp_path, capsys):
    local = str(tmp_path / "local")
    assert cli.main(["convert", "generic", native, "toy://converted", "--shard-bytes", "48KB", "--quiet"]) == 0
    assert cli.main(["convert", "generic", native, local, "--shard-bytes", "48KB", "--quiet"]) == 0
    assert cli.main(["upload", local, "toy://uploaded", "--quiet"]) == 0
    assert cli.main(["verify", "toy://converted", "--quiet"]) == 0
    assert "0 bad" in capsys.readouterr().out

    shards = sorted(name for name in os.listdir(local) if name.endswith(".tar"))
    assert len(shards) > 2  # several shards per split, so the test crosses shard boundaries
    for prefix in ("toy://converted", "toy://uploaded"):
        for name in shards + ["manifest.json"]:
            with open(os.path.join(local, name), "rb") as handle:
                local_bytes = handle.read()
            if name == "manifest.json":  # same dataset; only the run's timing may differ
                stored = json.loads(toy.objects[f"{prefix}/{name}"])
                expected = json.loads(local_bytes)
                stored.pop("timing", None), expected.pop("timing", None)
                assert stored == expected, prefix
            else:
                assert toy.objects[f"{prefix}/{name}"] == local_bytes, f"{prefix}/{name}"
        for split in ("train", "valid"):
            _assert_same(_streamed(prefix, split), _native_samples(native, split))


def test_a_read_only_scheme_is_refused_as_output_naming_the_writable_ones(toy, monkeypatch):
    monkeypatch.setattr(ToyScheme, "writable", False)
    with pytest.raises(wdsprep.ConfigError, match=r"toy://nowhere: cannot write to toy:// \(supported: .*s3://"):
        storage.open_store("toy://nowhere")
