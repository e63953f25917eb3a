"""`torchrun --nproc_per_node=2` (gloo, 127.0.0.1) training loops streaming shards from the local S3
server and, separately, from HTTP, GCS (fake-gcs-server), Azure (Azurite) and a private Hub repo: equal batch counts on uneven shards, every sample once per epoch
(plus the documented padding), nothing written to local disk, exact resume after k steps; and an
elastic resume: 3 ranks stopped mid-epoch, resumed on 2 ranks with another num_workers."""
import collections
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import EVENT, SUBPROCESS
from wdsprep.conversion import convert
from wdsprep.sources.generic import SOURCE as GENERIC
from wdsprep.testing import RangeHTTPServer, S3Server
from wdsprep.upload import upload

SCRIPT = Path(__file__).with_name("ddp_train.py")
TRAIN, VALID = 101, 20
STOP_AFTER = 5
TIMEOUT = SUBPROCESS
EPOCH = ("--seed", "7", "--epoch", "1")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """101 train samples in shards of 23,1,23,1,23,1,23,1,5 (no even split exists); valid: one shard of 20,
    so one rank gets no valid shard at all (the classic webdataset DDP hang)."""
    root = tmp_path_factory.mktemp("ddp")
    GENERIC.synth(str(root / "input"), seed=11, size="small", splits={"train": TRAIN, "valid": VALID})
    convert("generic", str(root / "input"), str(root / "shards"), shard_bytes="400KB")
    return root / "shards"


@pytest.fixture(scope="module")
def s3_source(shards):
    with S3Server() as server, server.environment():
        server.create_bucket("ddp")
        upload(str(shards), "s3://ddp/generic")
        yield "s3://ddp/generic/manifest.json", dict(server.env)


@pytest.fixture(scope="module")
def gs_source(shards, gcs_server):
    with gcs_server.environment():
        gcs_server.create_bucket("ddp-gs")
        upload(str(shards), "gs://ddp-gs/generic")
    yield "gs://ddp-gs/generic/manifest.json", dict(gcs_server.env)


@pytest.fixture(scope="module")
def az_source(shards, azurite_server):
    with azurite_server.environment():
        azurite_server.create_container("ddp-az")
        upload(str(shards), "az://ddp-az/generic")
    yield "az://ddp-az/generic/manifest.json", dict(azurite_server.env)


@pytest.fixture(scope="module")
def hf_source(shards):
    from wdsprep.testing import HubServer

    with HubServer() as hub:
        hub.create_repo("org/ddp", private=True)
        hub.upload_folder("org/ddp", shards, "generic")
        yield "hf://datasets/org/ddp/generic/manifest.json", dict(hub.env)


@pytest.fixture(scope="module")
def http_source(shards):
    with RangeHTTPServer(shards) as server:
        yield f"{server.url}/manifest.json", {}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _kill_tree(pid: int) -> None:
    for victim in [pid, *_descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun(manifest: str, out: Path, env_extra: dict, *args: str, nproc: int = 2) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **env_extra, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(SCRIPT), manifest, str(out), *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)  # torchrun starts each rank in a session of its own: kill them by pid
        stdout, stderr = process.communicate(timeout=EVENT)
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s:\n{stdout[-3000:]}{stderr[-20000:]}")
    assert process.returncode == 0, stdout[-3000:] + stderr[-20000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("backend", ["s3", "http", "gs", "az", "hf"])
def test_ddp_two_ranks_stream_equal_disjoint_resumable(backend, request, tmp_path, shards):
    manifest, env = request.getfixturevalue(f"{backend}_source")
    # epoch 1 of seed 7 is one where dealing whole shards to DataLoader workers gave the ranks 14 and 13
    # batches (workers of 26/25 and 28/23 samples): the equal-count worker split must hold here
    ranks = torchrun(manifest, tmp_path / "run", env, *EPOCH, "--second-split", "valid", "--stop-after", str(STOP_AFTER))

    # nothing was written to local disk by the training processes (the audit hook would have raised)
    assert [r["violations"] for r in ranks] == [[], []]

    # equal batch and sample counts on both ranks, on uneven shards
    epochs = [r["epoch"] for r in ranks]
    assert len(epochs[0]) == len(epochs[1]) > 0
    assert ranks[0]["all_counts"] == ranks[1]["all_counts"]
    # from the input, not from len(dataset): equalize="pad" gives every rank ceil(TRAIN / 2) samples
    per_rank = -(-TRAIN // 2)
    assert [r["samples_per_rank"] for r in ranks] == [per_rank, per_rank]
    assert [sum(len(b) for b in e) for e in epochs] == [per_rank, per_rank]

    # union = all samples; a sample appears twice only as padding, and exactly as much padding as documented
    keys = [k for e in epochs for b in e for k in b]
    assert set(keys) == {f"sample{i:06d}" for i in range(TRAIN)}
    repeats = sum(c - 1 for c in collections.Counter(keys).values())
    assert repeats == 2 * per_rank - TRAIN
    # within a rank, the padding replays that rank's own first sample (worker 0's first batch comes first)
    for e in epochs:
        rank_keys = [k for b in e for k in b]
        repeated = [k for k, count in collections.Counter(rank_keys).items() if count > 1]
        assert repeated in ([], [rank_keys[0]]), repeated

    # the valid split has one shard, shared by the two ranks (webdataset would give one rank nothing):
    # each rank 10 samples, 2 workers of 5, batches of 4 -> 2 + 2 batches, the last of each worker partial
    assert len(ranks[0]["second"]) == len(ranks[1]["second"]) == 4
    assert {k for r in ranks for b in r["second"] for k in b} == {f"sample{i:06d}" for i in range(VALID)}

    # the run stopped after k steps saw the epoch's first k batches; resumed from the saved states,
    # each rank yields exactly the rest of its epoch
    for r in ranks:
        assert r["partial"] == r["epoch"][:STOP_AFTER]
    resumed = torchrun(manifest, tmp_path / "resume", env, *EPOCH, "--resume", str(tmp_path / "run"))
    assert [r["violations"] for r in resumed] == [[], []]
    assert len(ranks) == len(resumed) == 2
    for before, after in zip(ranks, resumed):
        assert after["resumed"] == before["epoch"][STOP_AFTER:]


@pytest.mark.parametrize("backend", ["s3", "http"])
def test_ddp_three_ranks_stopped_resume_on_two_ranks_with_other_workers(backend, request, tmp_path, shards):
    manifest, env = request.getfixturevalue(f"{backend}_source")
    stopped = torchrun(manifest, tmp_path / "run", env, *EPOCH, "--stop-after", "4", "--workers", "2", "--only-partial",
                       nproc=3)
    assert [r["violations"] for r in stopped] == [[], [], []]
    first = [k for r in stopped for b in r["partial"] for k in b]
    assert [len(r["partial"]) for r in stopped] == [4, 4, 4]
    assert len(first) == len(set(first)) == 3 * 4 * 4  # 4 full batches of 4 per rank, nothing twice yet

    resumed = torchrun(manifest, tmp_path / "resume", env, *EPOCH, "--resume-all", str(tmp_path / "run"),
                       "--workers", "3", nproc=2)
    assert [r["violations"] for r in resumed] == [[], []]
    assert len(resumed[0]["resumed"]) == len(resumed[1]["resumed"])  # equal batch counts: no DDP hang
    second = [k for r in resumed for b in r["resumed"] for k in b]
    # the two parts together are the whole epoch, each sample once; the only repeat allowed is the one
    # padding sample of a rank when the 101 - 48 = 53 samples left do not split evenly over 2 ranks
    assert set(first) | set(second) == {f"sample{i:06d}" for i in range(TRAIN)}
    assert not set(first) & set(second)
    assert len(second) - len(set(second)) == (TRAIN - len(first)) % 2
