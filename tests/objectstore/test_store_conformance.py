"""The object store contract, the same tests for every remote scheme (`s3://` on moto, `gs://` on
fake-gcs-server, `az://` on Azurite, `hf://` on wdsprep.testing.HubServer: the `remote` fixture,
each behind the same proxy; `writable_remote`: the schemes wdsprep writes): ranged reads of exactly
the bytes asked, listing, a killed upload that leaves no manifest and resumes without writing
anything twice, conversion straight into the store, retries and the rate floor with the same error
lines, `verify`, `MapDataset[i]` by Range, a mix with a local part, `show`, and bad input as one
line. Expected values come from the local shards (tarfile-independent bytes) and from the
emulators' own records (generations, ETags, completed writes), never from the code under test."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import wdsprep
from tests.timeouts import EVENT as DEADLINE
from tests.timeouts import SUBPROCESS
from wdsprep.conversion import convert
from wdsprep.errors import ManifestError, ShardError
from wdsprep.shards.tarformat import iter_samples
from wdsprep.storage import open_store, read_range, read_url
from wdsprep.stream import iter_shard, load_manifest
from wdsprep.upload import upload

KEYS = [f"sample{i:06d}" for i in range(100)]


def _rows(shard_dir, split="train"):
    return json.loads((shard_dir / "manifest.json").read_bytes())["splits"][split]["shards"]


def _all_names(shard_dir):
    manifest = json.loads((shard_dir / "manifest.json").read_bytes())
    shards = [row["name"] for split in manifest["splits"].values() for row in split["shards"]]
    tables = [entry["file"] for kind in ("sample_tables", "shard_tables") for entry in manifest["tables"][kind].values()]
    return sorted(shards + tables)


def _wdsprep(*args, timeout=SUBPROCESS):
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())


def test_ranged_reads_ask_for_exactly_the_bytes(remote, generic_shards):
    url = remote.put(generic_shards, "ranges")
    name = _rows(generic_shards)[0]["name"]
    local = (generic_shards / name).read_bytes()
    remote.proxy.clear_log()
    asked = [(0, 512), (1000, 4096), (len(local) - 100, 100), (len(local) - 10, 50)]
    for offset, length in asked:
        assert read_range(f"{url}/{name}", offset, length) == local[offset : offset + length]
    ranges = [r["range"] for r in remote.requests_for(f"{url}/{name}")]
    assert ranges == [f"bytes={o}-{o + n - 1}" for o, n in asked]


def test_a_store_lists_stats_and_hashes_what_an_upload_put_there(writable_remote, generic_shards):
    url = writable_remote.put(generic_shards, "listed")
    store = open_store(url)
    assert store.supports_listing
    assert store.list_names() == sorted(_all_names(generic_shards) + ["manifest.json"])
    row = _rows(generic_shards)[0]
    name = row["name"]
    assert (store.stat(name), store.sha256(name), store.content_sha256(name)) == (row["bytes"], row["sha256"], row["sha256"])
    assert store.stat("absent.tar") is None and store.read_bytes("absent.tar") is None


def test_an_upload_killed_halfway_leaves_no_manifest_and_a_rerun_writes_nothing_twice(writable_remote, generic_shards):
    remote = writable_remote
    url = remote.url("killed")
    gate = remote.proxy.hold_writes_after(4, timeout=DEADLINE)
    process = subprocess.Popen([sys.executable, "-m", "wdsprep", "upload", str(generic_shards), url, "--quiet",
                                "--workers", "1"], env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE
    while gate.waiting == 0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert gate.waiting >= 1, process.communicate(timeout=DEADLINE)
    process.send_signal(signal.SIGKILL)  # killed with a write in flight
    process.wait(timeout=DEADLINE)
    gate.release(fail=True)
    remote.proxy.faults.gate = None
    before = remote.markers("killed")
    assert "manifest.json" not in before and 0 < len(before) < len(_all_names(generic_shards))
    with pytest.raises(ManifestError):
        load_manifest(url)

    result = _wdsprep("upload", str(generic_shards), url, "--quiet")
    assert result.returncode == 0, result.stderr
    shards_before = sum(name.endswith(".tar") for name in before)
    assert f"{shards_before} already there" in result.stdout
    after = remote.markers("killed")
    assert sorted(after) == sorted(_all_names(generic_shards) + ["manifest.json"])
    assert {name: after[name] for name in before} == before  # what the first run wrote was not written again
    assert sorted(s["__key__"] for s in wdsprep.dataset(url, "train", equalize=None)) == KEYS


def test_convert_writes_into_the_store_and_a_rerun_rebuilds_nothing(writable_remote, generic_shards):
    remote = writable_remote
    url = remote.url("converted")
    manifest = convert("generic", str(generic_shards.parent / "input"), url, shard_bytes="400KB")
    local = {split: [row["sha256"] for row in _rows(generic_shards, split)] for split in ("train", "valid")}
    assert {split: [row["sha256"] for row in manifest.shards(split)] for split in local} == local
    before = remote.markers("converted")
    again = convert("generic", str(generic_shards.parent / "input"), url, shard_bytes="400KB")
    assert again.timing["units_built"] == 0
    assert {name: marker for name, marker in remote.markers("converted").items() if name.endswith(".tar")} == \
        {name: marker for name, marker in before.items() if name.endswith(".tar")}
    assert sorted(s["__key__"] for s in wdsprep.dataset(url, "valid", equalize=None)) == KEYS[:20]


def _local_samples(path):
    with open(path, "rb") as stream:
        return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in iter_samples(stream, str(path))]


def _samples(stream):
    return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in stream]


def test_a_dropped_body_and_transient_errors_are_retried_from_the_missing_byte(remote, generic_shards):
    url = remote.put(generic_shards, "faults")
    row = _rows(generic_shards)[2]
    shard = f"{url}/{row['name']}"
    name = remote.name_of(shard)
    remote.proxy.clear_log()
    remote.proxy.drop_once(name, 100_000)
    remote.proxy.fail_next(name, 503, times=2)
    assert _samples(iter_shard(shard)) == _local_samples(generic_shards / row["name"])
    requests = remote.requests_for(shard)
    assert [r["status"] for r in requests[:2]] == [503, 503]
    cut = [r for r in requests if r["cut"]]
    assert len(cut) == 1
    start = int((cut[0]["range"] or "bytes=0-")[6:].split("-")[0])
    assert any(r["range"] and r["range"].startswith(f"bytes={start + cut[0]['sent']}-") for r in requests)


def test_a_trickling_body_ends_in_the_rate_floors_one_error(remote, generic_shards, monkeypatch):
    url = remote.put(generic_shards, "slow")
    monkeypatch.setenv("WDSPREP_MIN_RATE", "2000")
    monkeypatch.setenv("WDSPREP_RATE_WINDOW", "0.3")
    monkeypatch.setenv("WDSPREP_RETRIES", "2")
    shard = f"{url}/{_rows(generic_shards)[1]['name']}"
    remote.proxy.trickle(remote.name_of(shard), 100)
    with pytest.raises(ShardError) as caught:
        read_url(shard)
    message = str(caught.value)
    assert message.startswith(f"{shard}: stream failed at byte ") and "slower than 2000 bytes/s" in message
    assert message.endswith("3 times in a row")


def test_missing_objects_and_a_403_are_one_line_naming_the_url(remote):
    missing = remote.url("nothing/here.tar")
    with pytest.raises(ShardError, match=f"^{missing}: no such object$"):
        read_url(missing)
    assert len(remote.requests_for(missing)) == 1  # permanent: not retried
    denied = remote.url("denied/x.tar")
    remote.proxy.fail_next(remote.name_of(denied), 403)
    with pytest.raises(ShardError, match=f"^{denied}: (access denied|S3 error|HTTP 403)"):
        read_url(denied)
    result = _wdsprep("inspect", remote.url("nothing"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()  # (hf://: the inner URL names the commit it was pinned to)
    assert line.startswith(f"wdsprep: error: {remote.url('nothing')}/manifest.json: cannot read manifest (")
    assert line.endswith("/nothing/manifest.json: no such object)"), line


def test_verify_reads_a_remote_dataset_whole(remote, generic_shards):
    url = remote.put(generic_shards, "verified")
    result = _wdsprep("verify", url, "--quiet")
    assert result.returncode == 0, result.stderr
    shard_bytes = sum(r["sent"] for r in remote.proxy.requests if r["name"].endswith(".tar") or "lfs-objects" in r["name"])
    assert shard_bytes >= sum(row["bytes"] for split in ("train", "valid") for row in _rows(generic_shards, split))


def test_verify_names_a_shard_the_store_holds_corrupted(writable_remote, generic_shards, tmp_path):
    url = writable_remote.put(generic_shards, "corrupted")
    row = _rows(generic_shards)[3]
    data = bytearray((generic_shards / row["name"]).read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / row["name"]).write_bytes(bytes(data))
    open_store(url).upload_file(str(tmp_path / row["name"]), row["name"])  # the store now holds a flipped byte
    result = _wdsprep("verify", url, "--quiet")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert row["name"] in result.stderr + result.stdout


def test_mapdataset_reads_each_sample_by_range(remote, generic_shards):
    url = remote.put(generic_shards, "map")
    local = wdsprep.MapDataset(str(generic_shards), "train")
    remote.proxy.clear_log()
    mapped = wdsprep.MapDataset(url, "train")
    for i in (0, 57, 99):
        got, expected = mapped[i], local[i]
        assert got["__key__"] == expected["__key__"] and sorted(got) == sorted(expected)
        for field, value in expected.items():
            assert np.array_equal(got[field], value) if isinstance(value, np.ndarray) else got[field] == value, field
    shard_gets = [r for r in remote.proxy.requests if r["method"] == "GET" and r["status"] in (200, 206)
                  and (r["name"].endswith(".tar") or "lfs-objects" in r["name"])]
    assert shard_gets and all(r["range"] for r in shard_gets)  # never a whole shard
    assert sum(r["sent"] for r in shard_gets) < sum(row["bytes"] for row in _rows(generic_shards)) / 2


def test_a_mix_of_a_remote_part_and_a_local_part(remote, generic_shards):
    url = remote.put(generic_shards, "mixed")
    mixed = wdsprep.mix([wdsprep.Part(url, split="train", name="remote"),
                         wdsprep.Part(str(generic_shards), split="valid", name="local")],
                        mode="epochized", equalize=None)
    got = [s["__key__"] for s in mixed]
    assert sorted(got) == sorted(KEYS + KEYS[:20])


def test_show_draws_remote_samples(remote, generic_shards, tmp_path):
    url = remote.put(generic_shards, "shown")
    result = _wdsprep("show", url, "--out", str(tmp_path / "page.html"), "--samples", "2", "--quiet")
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "page.html").read_text()
    assert "sample0000" in page


def test_a_missing_bucket_is_one_line(writable_remote, generic_shards):
    remote = writable_remote
    container = remote.url("x").split("/")[2]
    absent = remote.url("x").replace(container, f"{container}-absent")
    result = _wdsprep("upload", str(generic_shards), absent, "--quiet")
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"wdsprep: error: {absent}") and "no such" in line, line


def test_each_dataloader_worker_makes_its_own_connections(remote, generic_shards):
    """A worker forked from a process that has a client (its pooled, kept-alive connections) makes
    its own: no request of a worker comes over a connection the main process opened."""
    url = remote.put(generic_shards, "workers")
    remote.proxy.clear_log()
    dataset = wdsprep.dataset(url, "train", equalize=None)  # the main process reads the manifest and tables
    before = len(remote.proxy.requests)
    parents = {r["conn"] for r in remote.proxy.requests}
    assert parents
    loader = wdsprep.Loader(dataset, batch_size=10, num_workers=2, collate_fn=lambda batch: [s["__key__"] for s in batch])
    keys = [key for batch in loader for key in batch]
    assert sorted(keys) == KEYS
    from_workers = remote.proxy.requests[before:]
    assert from_workers and not [r for r in from_workers if r["conn"] in parents]


def test_plain_webdataset_reads_the_store_after_import_wdsprep(remote, generic_shards):
    import webdataset as wds

    from wdsprep.storage.gopen import register_webdataset_schemes

    register_webdataset_schemes()
    url = remote.put(generic_shards, "plain")
    samples = list(wds.WebDataset(wdsprep.urls(url, "valid"), shardshuffle=False))
    assert sorted(s["__key__"] for s in samples) == KEYS[:20]


def test_a_conversion_killed_halfway_leaves_no_manifest_and_a_rerun_completes_it(writable_remote, generic_shards):
    remote = writable_remote
    url = remote.url("convert-killed")
    command = [sys.executable, "-m", "wdsprep", "convert", "generic", str(generic_shards.parent / "input"), url,
               "--shard-bytes", "400KB", "--quiet", "--workers", "1"]
    gate = remote.proxy.hold_writes_after(5, timeout=DEADLINE)
    process = subprocess.Popen(command, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE
    while gate.waiting == 0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert gate.waiting >= 1, process.communicate(timeout=DEADLINE)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=DEADLINE)
    gate.release(fail=True)
    remote.proxy.faults.gate = None
    before = {name: marker for name, marker in remote.markers("convert-killed").items() if name.endswith(".tar")}
    assert "manifest.json" not in remote.markers("convert-killed") and before
    result = subprocess.run(command, env=os.environ.copy(), capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr
    # (units whose journal records had not reached the store are built again, into the same bytes:
    # shards/journal.py)
    local = {split: [row["sha256"] for row in _rows(generic_shards, split)] for split in ("train", "valid")}
    manifest = load_manifest(url)
    assert {split: [row["sha256"] for row in manifest.shards(split)] for split in local} == local
    assert _wdsprep("verify", url, "--quiet").returncode == 0
