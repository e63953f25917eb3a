"""hf:// on the project's Hub endpoint (wdsprep.testing.HubServer): a revision is pinned to its commit
once and recorded, so a run resumed after its branch moved reads the commit it started on; `inspect`
and a mix file's parts show the commit; the token comes from HF_TOKEN or the login file; bad input
(no repo, a private repo without a token, a gated repo's 403, a revision that does not exist) is one
line. The bytes a run read are checked against the shards' own tar members (tarfile), not against
wdsprep's reader."""
import os
import subprocess
import sys
import tarfile

import pytest

import wdsprep
from tests.timeouts import SUBPROCESS
from wdsprep.conversion import convert
from wdsprep.sources.generic import SOURCE as GENERIC

SEED = 5


@pytest.fixture
def hub(hub_server, monkeypatch):
    for name, value in hub_server.env.items():
        monkeypatch.setenv(name, value)
    hub_server.clear_log()
    return hub_server


@pytest.fixture(scope="module")
def other_shards(tmp_path_factory):
    """Another dataset under the same shard names and keys (other seed: other bytes)."""
    root = tmp_path_factory.mktemp("other")
    GENERIC.synth(str(root / "input"), seed=99, size="small", samples=100, splits={"train": 100, "valid": 20})
    convert("generic", str(root / "input"), str(root / "shards"), shard_bytes="400KB")
    return root / "shards"


def _members(shard_dir) -> dict[str, dict[str, bytes]]:
    """key -> {member extension: bytes}, read with tarfile from every train shard."""
    samples: dict[str, dict[str, bytes]] = {}
    for path in sorted(shard_dir.glob("train-*.tar")):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                key, _, extension = member.name.partition(".")
                if not key.startswith("__"):
                    samples.setdefault(key, {})[extension] = tar.extractfile(member).read()
    return samples


def _fields(sample) -> dict[str, bytes]:
    return {name: bytes(value) for name, value in sample.items() if not name.startswith("__")}


def _wdsprep(*args, env=None):
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True,
                          timeout=SUBPROCESS, env=env or os.environ.copy())


def test_a_resumed_run_reads_the_recorded_commit_after_its_branch_moved(hub, generic_shards, other_shards):
    hub.create_repo("org/moving")
    first = hub.upload_folder("org/moving", generic_shards, "data")
    url = "hf://datasets/org/moving@main/data"
    dataset = wdsprep.dataset(url, "train", seed=SEED, equalize=None)
    assert dataset.manifest.url == f"hf://datasets/org/moving@{first}/data/manifest.json"
    stream = iter(dataset)
    before = [next(stream) for _ in range(30)]
    state = dataset.state_dict()
    assert state["location"] == dataset.manifest.url

    moved = hub.upload_folder("org/moving", other_shards, "data")  # main now names another dataset
    assert moved != first
    hub.clear_log()
    resumed = wdsprep.dataset(url, "train", seed=SEED, equalize=None)
    assert f"@{moved}/" in resumed.manifest.url  # a new run reads the new head...
    resumed.load_state_dict(state)
    after = list(resumed)  # ...a resumed one the commit its state recorded
    expected = _members(generic_shards)
    got = before + after
    assert sorted(s["__key__"] for s in got) == sorted(expected)  # the epoch, each sample once
    assert all(_fields(s) == expected[s["__key__"]] for s in got)  # with the first commit's bytes
    other = _members(other_shards)
    assert any(other[key] != expected[key] for key in expected)  # (which the new head does not hold)
    shard_reads = [r["path"] for r in hub.requests if "/resolve/" in r["path"] and r["path"].endswith(".tar")]
    assert not [path for path in shard_reads if f"/resolve/{first}/" not in path]  # no shard of the new head asked for


def test_without_a_state_a_new_run_reads_the_new_head(hub, generic_shards, other_shards):
    hub.create_repo("org/head")
    hub.upload_folder("org/head", generic_shards, "data")
    hub.upload_folder("org/head", other_shards, "data")
    got = list(wdsprep.dataset("hf://datasets/org/head/data", "train", equalize=None))
    other = _members(other_shards)
    assert all(_fields(s) == other[s["__key__"]] for s in got) and len(got) == 100


def test_a_url_naming_a_commit_is_not_resolved_again(hub, generic_shards):
    hub.create_repo("org/pinned")
    commit = hub.upload_folder("org/pinned", generic_shards, "data")
    hub.clear_log()
    assert len(list(wdsprep.dataset(f"hf://datasets/org/pinned@{commit}/data", "valid", equalize=None))) == 20
    assert not [r for r in hub.requests if r["path"].startswith("/api/")]


def test_inspect_and_a_mix_file_show_the_commit(hub, generic_shards, tmp_path):
    hub.create_repo("org/shown")
    commit = hub.upload_folder("org/shown", generic_shards, "data")
    result = _wdsprep("inspect", "hf://datasets/org/shown/data", "--samples", "1")
    assert result.returncode == 0, result.stderr
    assert f"manifest hf://datasets/org/shown@{commit}/data/manifest.json" in result.stdout
    mix = tmp_path / "mix.toml"
    mix.write_text(f'mode = "epochized"\n[[part]]\nlocation = "hf://datasets/org/shown/data"\nsplit = "train"\n'
                   f'[[part]]\nlocation = "{generic_shards}"\nsplit = "valid"\n')
    result = _wdsprep("inspect", str(mix))
    assert result.returncode == 0, result.stderr
    assert f"hf://datasets/org/shown@{commit}/data/manifest.json" in result.stdout
    assert sorted(s["__key__"] for s in wdsprep.mix(str(mix), equalize=None)) == \
        sorted([f"sample{i:06d}" for i in range(100)] + [f"sample{i:06d}" for i in range(20)])


def test_the_token_comes_from_the_login_file(hub, generic_shards, tmp_path, monkeypatch):
    hub.create_repo("org/private", private=True)
    hub.upload_folder("org/private", generic_shards, "data")
    (tmp_path / "token").write_text(hub.token)
    env = {**os.environ, "HF_TOKEN_PATH": str(tmp_path / "token")}
    env.pop("HF_TOKEN")
    result = _wdsprep("inspect", "hf://datasets/org/private/data", "--samples", "0", env=env)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", ["no-repo", "no-token", "gated", "no-revision", "no-file"])
def test_bad_hub_input_is_one_line(hub, generic_shards, tmp_path, case):
    hub.create_repo("org/closed", private=True)
    hub.upload_folder("org/closed", generic_shards, "data")
    hub.create_repo("org/gated", gated=True)
    env = {**os.environ, "HF_TOKEN_PATH": str(tmp_path / "none"), "HF_HOME": str(tmp_path)}
    url = {"no-repo": "hf://datasets/org/absent/data", "no-token": "hf://datasets/org/closed/data",
           "gated": "hf://datasets/org/gated/data", "no-revision": "hf://datasets/org/closed@v9/data",
           "no-file": "hf://datasets/org/closed/elsewhere"}[case]
    if case == "no-token":
        env.pop("HF_TOKEN")
    result = _wdsprep("inspect", url, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"wdsprep: error: {url}/manifest.json: cannot read manifest ("), line
    expected = {"no-repo": "no repository datasets/org/absent", "no-token": "no repository datasets/org/closed",
                "gated": "access denied to datasets/org/gated", "no-revision": "no revision 'v9' in datasets/org/closed",
                "no-file": "/elsewhere/manifest.json: no such object"}[case]
    assert expected in line, line
    if case in ("no-repo", "no-token", "gated"):
        assert "HF_TOKEN" in line  # says how to give a token


def test_a_files_storage_location_is_remembered_and_located_again_when_it_expires(hub, generic_shards):
    """The ranges of a commit's file after its first go straight to the Hub's file storage (one
    request each, not a `resolve` redirect and a GET); a remembered location that stopped answering
    (an expired signed URL) is forgotten, the file resolved again, and the read goes on."""
    from wdsprep.storage import read_range

    hub.create_repo("org/ranges")
    commit = hub.upload_folder("org/ranges", generic_shards, "data")
    name = sorted(p.name for p in generic_shards.glob("train-*.tar"))[0]
    local = (generic_shards / name).read_bytes()
    url = f"hf://datasets/org/ranges@{commit}/data/{name}"
    hub.clear_log()
    for offset in (0, 1000, 5000, 9000):
        assert read_range(url, offset, 512) == local[offset : offset + 512]
    paths = [r["path"].split("/")[1] for r in hub.requests]
    assert paths == ["datasets", "lfs-objects", "lfs-objects", "lfs-objects", "lfs-objects"]
    hub.expire_storage_urls()
    hub.clear_log()
    assert read_range(url, 20000, 512) == local[20000:20512]
    assert [(r["path"].split("/")[1], r["status"]) for r in hub.requests] == [
        ("lfs-objects", 404), ("datasets", 302), (hub.storage, 206)]


def test_a_loader_resumed_after_the_branch_moved_reads_the_recorded_commit(hub, generic_shards, other_shards):
    """The same through `wdsprep.Loader` and its DataLoader workers (the state is the Loader's)."""
    hub.create_repo("org/moving-loader")
    hub.upload_folder("org/moving-loader", generic_shards, "data")
    url = "hf://datasets/org/moving-loader/data"

    def loader():
        dataset = wdsprep.dataset(url, "train", seed=SEED, equalize=None)
        return wdsprep.Loader(dataset, batch_size=5, num_workers=2, collate_fn=lambda batch: batch)

    first = loader()
    batches = iter(first)
    before = [sample for _ in range(6) for sample in next(batches)]
    state = first.state_dict()
    del batches
    hub.upload_folder("org/moving-loader", other_shards, "data")
    resumed = loader()
    resumed.load_state_dict(state)
    after = [sample for batch in resumed for sample in batch]
    expected = _members(generic_shards)
    got = before + after
    assert sorted(s["__key__"] for s in got) == sorted(expected)
    assert all(_fields(s) == expected[s["__key__"]] for s in got)
