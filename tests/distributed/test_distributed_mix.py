"""A mix of a local, an HTTP and an S3 part (three conversions made by `wdsprep convert`), named in
one mix file, trained on by `torchrun --nproc_per_node=2` ranks with 2 `wdsprep.Loader` workers
each: every rank makes the same number of batches (a rank with one more would hang the gradient
all-reduce), and each rank's batches are exactly what test_mix_oracle's reference model says, from
the parts' key lists read out of the shards with `tarfile`."""
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.core.test_mix_oracle import model_worker, round_robin_batches
from tests.timeouts import SUBPROCESS
from wdsprep.sources.generic import SOURCE as GENERIC
from wdsprep.testing import RangeHTTPServer, S3Server
from wdsprep.upload import upload

from .test_distributed_ddp import torchrun

SIZES = {"local": 23, "http": 13, "s3": 7}  # train samples of each part
WEIGHTS = {"local": 1, "http": 2, "s3": 1.5}
SEED, EPOCH, WORKERS, BATCH = 5, 2, 2, 4


def convert(root: Path, seed: int, samples: int) -> Path:
    GENERIC.synth(str(root / "input"), seed=seed, size="small", splits={"train": samples})
    run = subprocess.run([sys.executable, "-m", "wdsprep", "convert", "generic", str(root / "input"),
                          str(root / "shards"), "--shard-bytes", "60KB", "--quiet"],
                         capture_output=True, text=True, timeout=SUBPROCESS)
    assert run.returncode == 0, run.stderr
    return root / "shards"


def shard_keys(shards: Path) -> list[list[str]]:
    """The train split's keys, shard by shard in manifest order, read with tarfile."""
    manifest = json.loads((shards / "manifest.json").read_text())
    out = []
    for row in manifest["splits"]["train"]["shards"]:
        with tarfile.open(shards / row["name"]) as archive:
            keys = dict.fromkeys(m.name.split(".", 1)[0] for m in archive.getmembers() if not m.name.startswith("__"))
        assert len(keys) == row["samples"]
        out.append(list(keys))
    return out


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    made = {name: convert(root / name, seed, SIZES[name]) for seed, name in enumerate(SIZES, 21)}
    with S3Server() as s3, s3.environment(), RangeHTTPServer(made["http"]) as http:
        s3.create_bucket("mix")
        upload(str(made["s3"]), "s3://mix/part")
        locations = {"local": str(made["local"] / "manifest.json"), "http": f"{http.url}/manifest.json",
                     "s3": "s3://mix/part/manifest.json"}
        yield made, locations, dict(s3.env)


def test_a_local_http_and_s3_mix_over_two_ranks_gives_equal_batches_of_the_models_keys(parts, tmp_path):
    made, locations, env = parts
    keys = [shard_keys(made[name]) for name in SIZES]
    assert [sum(map(len, k)) for k in keys] == list(SIZES.values())
    assert all(len(k) > 1 for k in keys)  # several shards per part
    mix_file = tmp_path / "mix.toml"
    mix_file.write_text('stop = "all"\n' + "".join(
        f'\n[[part]]\nname = "{name}"\nlocation = "{locations[name]}"\nweight = {WEIGHTS[name]}\n' for name in SIZES))
    ranks = torchrun(str(mix_file), tmp_path / "run", env, "--mix", "--seed", str(SEED), "--epoch", str(EPOCH),
                     "--workers", str(WORKERS), "--batch-size", str(BATCH))
    assert [r["violations"] for r in ranks] == [[], []]  # nothing written to local disk
    assert len(ranks[0]["epoch"]) == len(ranks[1]["epoch"]) > 0  # equal batches: the all-reduce never hung
    names = list(SIZES)
    for rank, result in enumerate(ranks):
        streams = []
        for worker in range(WORKERS):
            stream = model_worker(keys, list(WEIGHTS.values()), world=2, rank=rank, workers=WORKERS, worker=worker,
                                  equalize="pad", seed=SEED, epoch=EPOCH, stop="all")
            streams.append([f"{names[int(p)]}/{key}" for p, key in stream])
        assert result["epoch"] == [batch for _, batch in round_robin_batches(streams, BATCH)], rank
    seen = {key.split("/")[0] for r in ranks for batch in r["epoch"] for key in batch}
    assert seen == set(SIZES)
